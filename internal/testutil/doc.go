// Package testutil holds what the tests of several ddstore packages share:
// an output buffer that an agent's goroutines and a test may use at once,
// a poll with a deadline that tests wait on instead of sleeping, and the
// plumbing that re-executes a test binary as a helper process (a client
// killed mid-read, a rank of a soak, an agent to kill with SIGKILL).
//
// Only _test.go files import it: nothing here belongs in a binary.
package testutil
