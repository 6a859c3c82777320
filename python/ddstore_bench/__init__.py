"""ddstore's benchmarks and the CosmoFlow-like training run, kept apart from
the client library (`import ddstore` never loads them):

    python -m ddstore_bench.bench [--quick]       # the Python client's reads next to the Go client's
    python -m ddstore_bench.microbench [--mpi]    # DDStore's microbenchmark
    python -m ddstore_bench.bench_tier            # reads from backing files (HDF5)
    python -m ddstore_bench.cosmoflow train|io    # DDP training with each loader, SOLAR's report
    python -m ddstore_bench.report --out DIR      # the figures of docs/benchmarks.md
"""
