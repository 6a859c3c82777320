package ddstore

// Version is the release of this module; `ddstore version` prints it with
// the commit it was built from.
const Version = "0.1.0-dev"
