package layout

// The item types ddstore knows, by the names numpy and torch give them: the
// one table the client (ddstore.Dtype), the file readers (internal/source)
// and, through the shared vectors, the Python client take their sizes from.

// dtypes are the item type names with their sizes, in the order error
// messages and flag help list them.
var dtypes = []struct {
	name string
	size int64
}{
	{"bool", 1}, {"int8", 1}, {"int16", 2}, {"int32", 4}, {"int64", 8},
	{"uint8", 1}, {"uint16", 2}, {"uint32", 4}, {"uint64", 8},
	{"float16", 2}, {"bfloat16", 2}, {"float32", 4}, {"float64", 8},
}

// ItemSize is the size of an item of the named type; false for a name
// ddstore does not know.
func ItemSize(dtype string) (int64, bool) {
	for _, d := range dtypes {
		if d.name == dtype {
			return d.size, true
		}
	}
	return 0, false
}

// Dtypes lists the item type names ddstore knows.
func Dtypes() []string {
	names := make([]string, len(dtypes))
	for i, d := range dtypes {
		names[i] = d.name
	}
	return names
}
