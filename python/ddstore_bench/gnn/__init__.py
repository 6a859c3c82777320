"""The atomistic GNN job: a dataset of real structures (metal clusters and
bulk cells, energies and forces by ASE's EMT calculator) and a small
message-passing network that learns their energies.

    python -m ddstore_bench.gnn generate --out DIR [--samples N]

See :mod:`ddstore_bench.gnn.data` for the dataset and its files and
:mod:`ddstore_bench.gnn.model` for the network.
"""
