//go:build !fabric || !cgo

package transport

import "context"

// FabricBuilt says whether this binary has the libfabric transport (build
// tag fabric).
const FabricBuilt = false

// FabricLibrary names the libfabric a build with the tag fabric runs with;
// "" here.
func FabricLibrary() string { return "" }

// Fabric is the libfabric transport; this build has none (no tag fabric):
// NewFabric fails and says how to get one.
type Fabric struct{}

// NewFabric fails: the binary was built without the tag fabric.
func NewFabric(FabricOptions) (*Fabric, error) { return nil, errNoFabric() }

func (*Fabric) Fetch(context.Context, string, string, int64, []int64, [][]byte) error {
	return errNoFabric()
}
func (*Fabric) Close() error                           { return nil }
func (*Fabric) Expose([]byte, int64) (Exposure, error) { return Exposure{}, errNoFabric() }
func (*Fabric) Withdraw(_ Exposure, unmap func())      { unmap() }
func (*Fabric) Provider() string                       { return "" }
func (*Fabric) Name() []byte                           { return nil }
func (*Fabric) TokenKey() uint64                       { return 0 }
func (*Fabric) Key(Exposure) uint64                    { return 0 }
