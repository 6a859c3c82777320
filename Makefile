# ddstore: build, test and benchmark. `make` alone lists the targets; CI
# (.ci/run) calls the same ones.

# The Go toolchain lives in /usr/local/go on the development and CI machines,
# which a fresh login shell may not have on PATH. GOFLAGS is left as it is.
export PATH := /usr/local/go/bin:$(PATH)

GO       ?= go
BIN      := bin/ddstore
# FUZZTIME bounds each fuzz target in fuzz-short: a count of inputs, not a
# duration, because go1.26 -fuzztime with a duration can fail spuriously with
# "context deadline exceeded" (golang/go#75804).
FUZZTIME ?= 200000x
# RACE is the race-detector flag of `make test`; it needs cgo and a C
# compiler. `make test RACE=` runs the tests without it.
RACE     ?= -race
# SOAK and KILLS size `make soak` (docs/reliability.md); `make test` runs
# the same tests shorter (3 s, 300 kills) under -race.
SOAK     ?= 60s
KILLS    ?= 1000

.DEFAULT_GOAL := help
# Debian packages the tests need (no PyPI on these machines): Python with
# numpy, torch and mpi4py, pytest, venv for the install check, Open MPI
# and MPICH (the MPI transport is tested with each), gcc for the race
# detector, matplotlib for `make report`, and libfabric for the fabric
# transport's tests.
DEB_PACKAGES := gcc python3 python3-numpy python3-pytest python3-venv python3-setuptools python3-pip \
	python3-torch python3-mpi4py openmpi-bin libopenmpi-dev libhdf5-dev python3-h5py python3-matplotlib \
	libfabric-dev pkg-config mpich libmpich-dev python3-ase
PYTHON   := /usr/bin/python3

.PHONY: help build build-mpi build-mpich build-fabric bench-mpi deps test gotest pytest python fuzz-short soak bench bench-quick cosmoflow cosmoflow-io gnn micro micro-mpi report scale gobench clean

help: ## list the targets
	@echo 'Usage: make TARGET'
	@echo
	@grep -hE '^[A-Za-z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

# The binary reads HDF5 files (ingest, backing files) when libhdf5-dev is
# installed (make deps installs it); without it, a pure-Go build that says so
# when asked for an HDF5 file. Expanded when a recipe runs (=, not :=), so a
# `make test` that installs libhdf5-dev first builds with it.
HDF5_TAGS = $(shell test -e /usr/include/hdf5/serial/hdf5.h && echo hdf5)

build: ## build the ddstore binary into bin/ddstore (with HDF5 where libhdf5-dev is installed)
	$(GO) build -tags '$(HDF5_TAGS)' -o $(BIN) ./cmd/ddstore

# The MPI transport (docs/build_tags.md) links the MPI library, so its binary
# is a separate one: bin/mpi/ddstore (named ddstore, so that it starts
# agents of its own kind).
MPI_BIN  := bin/mpi/ddstore

build-mpi: ## build bin/mpi/ddstore with the MPI transport (tag mpi; links the MPI named mpi-c: libopenmpi-dev, or libmpich-dev alone)
	$(GO) build -tags '$(HDF5_TAGS) mpi' -o $(MPI_BIN) ./cmd/ddstore

# The MPI transport linked with MPICH where Open MPI is installed too (tags
# mpi mpich): bin/mpich/ddstore, launched with mpiexec.mpich
# (DDSTORE_MPIRUN=mpiexec.mpich for ddstore's own launches: bench, tests).
MPICH_BIN := bin/mpich/ddstore

build-mpich: ## build bin/mpich/ddstore with the MPI transport on MPICH (tags mpi mpich; needs libmpich-dev)
	$(GO) build -tags '$(HDF5_TAGS) mpi mpich' -o $(MPICH_BIN) ./cmd/ddstore

# The libfabric transport (docs/build_tags.md): bin/fabric/ddstore.
FABRIC_BIN := bin/fabric/ddstore

build-fabric: ## build bin/fabric/ddstore with the libfabric transport (tag fabric; needs libfabric-dev)
	$(GO) build -tags '$(HDF5_TAGS) fabric' -o $(FABRIC_BIN) ./cmd/ddstore

deps: ## install the Debian packages the tests need (apt-get, as root), if missing
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		if [ "$$(id -u)" != 0 ]; then echo "make deps: run as root, or install:" $$missing; exit 1; fi; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

test: deps gotest pytest python ## every test: Go (gofmt, vet, pure-Go build, race, fuzz-short), Python, pip install

gotest: ## gofmt check, go vet, pure-Go build, race tests, HDF5/MPI/MPICH/libfabric tagged tests (.ci/gotest.sh), then fuzz-short
	@GO='$(GO)' RACE='$(RACE)' bash .ci/gotest.sh
	@$(MAKE) --no-print-directory fuzz-short

pytest: build ## the Python client's tests against agents built from this tree
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m pytest -q tests

python: build ## pip-install the Python package (with the binary bundled) into .venv, and import it
	mkdir -p python/ddstore/bin && cp $(BIN) python/ddstore/bin/ddstore
	test -x .venv/bin/python || $(PYTHON) -m venv --system-site-packages .venv
	.venv/bin/pip install -q --no-build-isolation --no-deps --force-reinstall ./python
	cd / && $(CURDIR)/.venv/bin/python -c 'import ddstore, ddstore._agent as a; print("ddstore", ddstore.__version__, "binary", a.find_binary())'

fuzz-short: ## run every fuzz target in the repo for FUZZTIME inputs each
	@FUZZTIME='$(FUZZTIME)' GO='$(GO)' bash .ci/fuzz-short.sh

soak: build ## fault and load tests at full length, no -race: SOAK (60s) of random batches on 2 nodes, KILLS (1000) clients killed
	DDSTORE_SOAK=$(SOAK) DDSTORE_CLIENT_KILLS=$(KILLS) DDSTORE_SOAK_BIN=$(CURDIR)/$(BIN) \
		$(GO) test -count=1 -v -timeout 30m -run '^(TestSoak|TestClientLoss)$$' .

bench: build ## run the store benchmark (bin/ddstore bench)
	$(BIN) bench

bench-quick: build ## run the short store benchmark (bin/ddstore bench --quick)
	$(BIN) bench --quick

bench-mpi: build-mpi ## cross-node reads over tcp and mpi side by side, next to DDStore's figures (docs/benchmarks.md)
	$(MPI_BIN) bench --sizes 64,4K,64K --transports tcp,mpi

# COSMOFLOW_ARGS: more options of `python -m ddstore_bench.cosmoflow train|io`
# (--help), e.g. --cold, --json, or a larger size. deps first, then build in
# a new make, so that a libhdf5-dev just installed is seen by HDF5_TAGS.
cosmoflow: deps ## the training benchmark: CosmoFlow-like DDP training with each loader (2 ranks, ~2 min), SOLAR's report, a comparison
	@$(MAKE) --no-print-directory build
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.cosmoflow train $(COSMOFLOW_ARGS)

cosmoflow-io: deps ## SOLAR's I/O evaluation (4 ranks, batch 16, 3 epochs, no model), page cache dropped before every epoch
	@$(MAKE) --no-print-directory build
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.cosmoflow io --cold $(COSMOFLOW_ARGS)

# GNN_ARGS: more options of `python -m ddstore_bench.gnn train` (--help).
gnn: deps ## the atomistic GNN job: ASE structures (EMT energies), DDP training of a message-passing network with each loader (2 ranks)
	@$(MAKE) --no-print-directory build
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.gnn train $(GNN_ARGS)

micro: build ## DDStore's microbenchmark from Python: µs per row of get() and get_batch(128), 3 KiB and 1 MiB rows
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.microbench

micro-mpi: build ## the same cross-node, 2 ranks of mpirun: through the agents and by MPI gets from the rank (Store(method="mpi"))
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.microbench --mpi

# REPORT_ARGS: e.g. --replot (plot the saved JSON again) or --quick.
# make scale: the scale driver on 2 to 128 simulated nodes of this machine,
# 8 ranks each, the model to 1,024 nodes and a plot per cost
# (docs/scale.md). SCALE_ARGS are ddstore bench scale's flags;
# SCALE_BEFORE a scale.json of an earlier build to plot beside.
SCALE_ARGS   ?= --nodes 2,4,8,16,32,64,128 --rounds 3 --duration 1s
SCALE_BEFORE ?=
scale: build ## the scale driver (2 to 128 simulated nodes), the model to 1,024 nodes and its plots in docs/scale/ (a few minutes)
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.scale --out $(CURDIR)/docs/scale --args '$(SCALE_ARGS)' $(if $(SCALE_BEFORE),--before $(abspath $(SCALE_BEFORE)))

report: build ## measure, then plot docs/figures/*.png (loading time, hit rate, throughput); needs python3-matplotlib
	cd python && DDSTORE_BIN=$(CURDIR)/$(BIN) $(PYTHON) -m ddstore_bench.report --out $(CURDIR)/docs/figures $(REPORT_ARGS)

gobench: ## run the Go benchmarks of every package (1 s each)
	$(GO) test -run '^$$' -bench . -benchtime 1s ./...

clean: ## remove bin/
	rm -rf bin/
