#!/usr/bin/env bash
# The Go half of `make test` (its gotest target): gofmt, go vet, the pure-Go
# build, the race tests of every package, then the tagged tests of the
# native dependencies that are installed: HDF5, MPI on Open MPI and on
# MPICH, libfabric. The cluster tests run again over MPI and libfabric are
# the root package's tests named TestCluster... (cluster_test.go says why),
# so a new one needs no edit here. Each command is echoed before it runs.
#
# GO (default go) is the toolchain; RACE (default -race) the race flag,
# empty to run without the race detector. fuzz-short is a target of its
# own (.ci/fuzz-short.sh), which make gotest runs after this script.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
GO="${GO:-go}"
RACE="${RACE--race}"

# CLUSTER_TESTS selects the cluster tests for -run.
CLUSTER_TESTS='^TestCluster'

# run echoes a command and runs it.
run() {
	echo "+ $*"
	"$@"
}

echo '== gofmt -l'
out=$(find . -name '*.go' -not -path './.git/*' -not -path './vendor/*' \
	-not -path '*/testdata/*' -print | xargs -r gofmt -l)
if [ -n "$out" ]; then
	echo "gofmt would reformat:"
	echo "$out"
	exit 1
fi

echo '== go vet'
run "$GO" vet ./...

echo '== pure-Go build (CGO_ENABLED=0)'
run env CGO_ENABLED=0 "$GO" build ./...

echo "== go test $RACE"
if [ -n "$RACE" ] && [ "$("$GO" env CGO_ENABLED)" != 1 ]; then
	echo "make test: 'go test $RACE' needs cgo and a C compiler (apt-get install gcc), or run 'make test RACE='"
	exit 1
fi
# $RACE unquoted: empty, it is no argument at all.
run "$GO" test $RACE -count=1 -timeout 20m ./...

echo '== HDF5 (build tag hdf5, cgo on libhdf5)'
run "$GO" vet -tags hdf5 . ./internal/source/ ./internal/cli/
run "$GO" test $RACE -tags hdf5 -count=1 ./internal/source/ ./internal/cli/
run "$GO" test $RACE -tags hdf5 -count=1 -run '^TestClusterRaggedBackedHDF5$' .

if command -v mpicc >/dev/null 2>&1; then
	echo '== MPI (build tag mpi, cgo on MPI): the transport between ranks, then the cluster tests over it'
	run "$GO" vet -tags mpi ./...
	run "$GO" test $RACE -tags mpi -count=1 ./internal/transport/ ./internal/bench/
	run "$GO" test $RACE -tags mpi -count=1 -run '^TestMPIReads$' .
	run env DDSTORE_TEST_TRANSPORT=mpi "$GO" test $RACE -count=1 -run "$CLUSTER_TESTS" .
else
	echo '== MPI: no mpicc, skipped (apt-get install libopenmpi-dev)'
fi

if pkg-config --exists mpich 2>/dev/null && command -v mpiexec.mpich >/dev/null 2>&1; then
	echo '== MPICH (build tags mpi mpich, launched by mpiexec.mpich): the same MPI tests on the other MPI'
	run "$GO" vet -tags 'mpi mpich' ./...
	run env DDSTORE_MPIRUN=mpiexec.mpich "$GO" test $RACE -tags 'mpi mpich' -count=1 ./internal/transport/ ./internal/bench/
	run env DDSTORE_MPIRUN=mpiexec.mpich "$GO" test $RACE -tags 'mpi mpich' -count=1 -run '^TestMPIReads$' .
	run env DDSTORE_MPIRUN=mpiexec.mpich DDSTORE_TEST_TRANSPORT=mpi "$GO" test $RACE -count=1 -run "$CLUSTER_TESTS" .
else
	echo '== MPICH: not installed, skipped (apt-get install mpich libmpich-dev)'
fi

if pkg-config --exists libfabric 2>/dev/null; then
	echo '== libfabric (build tag fabric, cgo on libfabric): the transport on loopback, then the cluster tests over it'
	run "$GO" vet -tags fabric ./...
	# -run Fabric: the conformance suite over libfabric (TestConformanceFabric)
	# and the tests of libfabric's own.
	run "$GO" test $RACE -tags fabric -count=1 -run Fabric ./internal/transport/
	run env DDSTORE_TEST_TRANSPORT=fabric "$GO" test $RACE -tags fabric -count=1 -run "$CLUSTER_TESTS" .
else
	echo '== libfabric: not installed, skipped (apt-get install libfabric-dev)'
fi
