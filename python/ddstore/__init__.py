"""ddstore: a training dataset sharded in the memory of a job's nodes; any
rank reads any sample by its global index.

    import numpy as np, ddstore
    s = ddstore.Store()                      # rank/size from torchrun, Slurm, Open MPI, MPICH
    s.add("x", np.arange(30, dtype=np.float32).reshape(10, 3))   # collective
    out = np.empty((2, 3), np.float32)
    s.get_batch("x", out, [7, 2])
"""

from ._errors import (ArgumentError, ArgumentTypeError, AuthError, BadBuffer, BadDataset, ClosedError, Error,
                      FreedVariable, GeometryError, IndexOutOfRange, InternalError, LoaderTimeout, NoAgent, PeerError,
                      ProtocolError, RegionLost, Timeout, UnknownField, UnknownVariable, Unsupported, VariableExists)
from . import schedule
from .comm import FileComm
from .store import Store

__version__ = "0.1.0.dev0"

__all__ = ["Store", "FileComm", "Error", "IndexOutOfRange", "GeometryError", "UnknownVariable", "VariableExists",
           "BadBuffer", "FreedVariable", "ClosedError", "Timeout", "PeerError", "ProtocolError", "NoAgent",
           "ArgumentError", "InternalError", "AuthError", "ArgumentTypeError", "UnknownField", "Unsupported",
           "BadDataset", "LoaderTimeout", "RegionLost", "__version__"]
