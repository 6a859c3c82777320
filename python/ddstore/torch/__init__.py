"""The PyTorch layer of ddstore (DDStore's `pyddstore.torch`): a map-style
dataset whose samples live sharded in the memory of the job's nodes, readers
that attach to it by name, windows over it, a DataLoader whose workers are
threads, and a batch sampler that follows `ddstore schedule`.

    import torch, ddstore
    from ddstore.torch import BudgetSampler, DistDataset, DistDatasetReader, Graphs, ThreadDataLoader

    source = torch.utils.data.TensorDataset(features, labels)  # fixed-shape samples
    ds = DistDataset(source, "train")         # collective: each rank loads its share
    x, y = ds[12345]                          # any rank reads any sample
    loader = ThreadDataLoader(ds, batch_size=256, shuffle=True, num_workers=4)
    for x, y in loader:                       # one get_batch per field per batch
        ...
    # elsewhere, in a process that loaded nothing:
    rd = DistDatasetReader("train", store=ddstore.Store())

    # graphs (dicts: x [n_i, F], edge_index [2, e_i], y): ragged fields, found while loading
    gs = DistDataset(graphs, "qm9")
    loader = ThreadDataLoader(gs, batch_sampler=BudgetSampler(gs, budget=4096, seed=1),
                              collate_fn=Graphs(edges={"edge_index": "x"}))   # + batch, ptr

Modules: dataset (DistDataset, DistDatasetReader, WindowedDataset, row_of,
and how a dataset is stored, ragged fields included), collate (Packed,
Padded, Graphs: batches of samples whose fields vary in size), loader
(ThreadDataLoader), sampler (ScheduledSampler), budget (BudgetSampler:
batches filled up to a budget of atoms or tokens), mixture (MixtureDataset,
MixtureSampler: several datasets mixed by weights or counts). Every name is also
importable from ddstore.torch.
"""

from ._schema import _FIELDS, _META  # noqa: F401  (the reserved variables, for pyddstore)
from .dataset import DistDataset, DistDatasetReader, WindowedDataset, row_of
from .budget import BudgetSampler
from .collate import Graphs, Packed, Padded
from .loader import ThreadDataLoader
from .sampler import ScheduledSampler
from .mixture import MixtureDataset, MixtureSampler

__all__ = ["DistDataset", "DistDatasetReader", "WindowedDataset", "row_of", "ThreadDataLoader", "ScheduledSampler",
           "BudgetSampler", "MixtureDataset", "MixtureSampler", "Packed", "Padded", "Graphs"]
