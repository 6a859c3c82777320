"""CosmoFlow-style main job: a synthetic dataset (``python -m ddstore.cosmoflow
generate``, see :mod:`ddstore.cosmoflow.data`) read by a DDP training run with
each loader.

    from ddstore.cosmoflow import data
    paths = data.generate("/tmp/cf", samples=64)      # reused when it exists
    x, y = data.sample(seed=0, i=3, size=32, channels=4)
"""

from . import data

__all__ = ["data"]
