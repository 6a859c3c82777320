"""CosmoFlow-style training benchmark: a synthetic dataset (``python -m ddstore_bench.cosmoflow
generate``, see :mod:`ddstore_bench.cosmoflow.data`) read by a DDP training run with
each loader.

    from ddstore_bench.cosmoflow import data
    paths = data.generate("/tmp/cf", samples=64)      # reused when it exists
    x, y = data.sample(seed=0, i=3, size=32, channels=4)
"""

from . import data

__all__ = ["data"]
