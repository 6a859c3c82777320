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

.DEFAULT_GOAL := help
# Debian packages the tests need (no PyPI on these machines): Python with
# numpy, torch and mpi4py, pytest, venv for the install check, Open MPI, and
# gcc for the race detector.
DEB_PACKAGES := gcc python3 python3-numpy python3-pytest python3-venv python3-setuptools python3-pip \
	python3-torch python3-mpi4py openmpi-bin libopenmpi-dev libhdf5-dev python3-h5py
PYTHON   := /usr/bin/python3

.PHONY: help build deps test gotest pytest python fuzz-short bench bench-quick gobench clean

help: ## list the targets
	@echo 'Usage: make TARGET'
	@echo
	@grep -hE '^[A-Za-z0-9_.-]+:.*## ' $(MAKEFILE_LIST) | \
		awk 'BEGIN {FS = ":.*## "} {printf "  %-12s %s\n", $$1, $$2}'

# The binary reads HDF5 files (ingest, backing files) when libhdf5-dev is
# installed (make deps installs it); without it, a pure-Go build that says so
# when asked for an HDF5 file.
HDF5_TAGS := $(shell test -e /usr/include/hdf5/serial/hdf5.h && echo hdf5)

build: ## build the ddstore binary into bin/ddstore (with HDF5 where libhdf5-dev is installed)
	$(GO) build -tags '$(HDF5_TAGS)' -o $(BIN) ./cmd/ddstore

deps: ## install the Debian packages the tests need (apt-get, as root), if missing
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing:" $$missing; \
		if [ "$$(id -u)" != 0 ]; then echo "make deps: run as root, or install:" $$missing; exit 1; fi; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

test: deps gotest pytest python ## every test: Go (gofmt, vet, pure-Go build, race, fuzz-short), Python, pip install

gotest: ## gofmt check, go vet, pure-Go build, race tests, then fuzz-short
	@echo '== gofmt -l'
	@out=$$(find . -name '*.go' -not -path './.git/*' -not -path './vendor/*' \
		-not -path '*/testdata/*' -print | xargs -r gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt would reformat:"; echo "$$out"; exit 1; fi
	@echo '== go vet'
	$(GO) vet ./...
	@echo '== pure-Go build (CGO_ENABLED=0)'
	CGO_ENABLED=0 $(GO) build ./...
	@echo '== go test $(RACE)'
	@if [ -n "$(RACE)" ] && [ "$$($(GO) env CGO_ENABLED)" != 1 ]; then \
		echo "make test: 'go test $(RACE)' needs cgo and a C compiler (apt-get install gcc), or run 'make test RACE='"; \
		exit 1; fi
	$(GO) test $(RACE) -count=1 -timeout 20m ./...
	@echo '== HDF5 (build tag hdf5, cgo on libhdf5)'
	$(GO) vet -tags hdf5 ./internal/source/ ./internal/cli/
	$(GO) test $(RACE) -tags hdf5 -count=1 ./internal/source/ ./internal/cli/
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

bench: build ## run the store benchmark (bin/ddstore bench)
	$(BIN) bench

bench-quick: build ## run the short store benchmark (bin/ddstore bench --quick)
	$(BIN) bench --quick

gobench: ## run the Go benchmarks of every package (1 s each)
	$(GO) test -run '^$$' -bench . -benchtime 1s ./...

clean: ## remove bin/
	rm -rf bin/
