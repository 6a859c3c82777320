package ddstore_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// TestClusterTestsNamed: every test of this package that starts a cluster,
// itself or through a helper of these files, is named TestCluster..., so
// that the runs over MPI and libfabric, which select the cluster tests by
// that prefix, miss none. A cluster test that cannot hold over every
// transport skips on the ones it does not (as TestClusterMPIOneSided does
// off MPI) rather than leave the prefix.
func TestClusterTestsNamed(t *testing.T) {
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	// uses: the identifiers each top-level function of the test files
	// names, a call graph good enough for functions of one package.
	uses := map[string]map[string]bool{}
	fset := token.NewFileSet()
	for _, f := range files {
		af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range af.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Recv != nil {
				continue
			}
			names := map[string]bool{}
			ast.Inspect(fd.Body, func(n ast.Node) bool {
				if id, ok := n.(*ast.Ident); ok {
					names[id.Name] = true
				}
				return true
			})
			uses[fd.Name.Name] = names
		}
	}
	var startsCluster func(fn string, seen map[string]bool) bool
	startsCluster = func(fn string, seen map[string]bool) bool {
		if seen[fn] {
			return false
		}
		seen[fn] = true
		for name := range uses[fn] {
			if name == "startCluster" || startsCluster(name, seen) {
				return true
			}
		}
		return false
	}
	found := 0
	for fn := range uses {
		if !strings.HasPrefix(fn, "Test") || !startsCluster(fn, map[string]bool{}) {
			continue
		}
		found++
		if !strings.HasPrefix(fn, "TestCluster") {
			t.Errorf("%s starts a cluster but is not named TestCluster...: the runs over MPI and libfabric would miss it", fn)
		}
	}
	if found == 0 {
		t.Fatal("no test starts a cluster: the call graph of the test files was not read")
	}
}
