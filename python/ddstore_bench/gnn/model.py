"""A small message-passing network in plain torch (no graph library):
atoms embedded by element, a few rounds of messages along the edges
weighted by a radial basis of the edge length (a continuous filter, as in
SchNet), summed into each atom by ``index_add_``, and the structure's energy
as the sum of its atoms' contributions.

A batch is a graph of several structures, as graph libraries collate them:
the atoms of all structures concatenated, ``batch`` giving each atom's
structure, ``edge_index`` (2, E) into the concatenated atoms (each
structure's pairs shifted by the atoms before it), ``dist`` (E,).
"""

import torch
from torch import nn

MAX_Z = 80


class RadialBasis(nn.Module):
    def __init__(self, n, cutoff):
        super().__init__()
        self.register_buffer("centres", torch.linspace(0.0, cutoff, n))
        self.gamma = 10.0 / cutoff
        self.cutoff = cutoff

    def forward(self, d):
        d = d.unsqueeze(-1)
        envelope = 0.5 * (torch.cos(torch.pi * d.clamp(max=self.cutoff) / self.cutoff) + 1.0)
        return torch.exp(-self.gamma * (d - self.centres) ** 2) * envelope


class Interaction(nn.Module):
    def __init__(self, hidden, basis):
        super().__init__()
        self.filter = nn.Sequential(nn.Linear(basis, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.update = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, h, edge_index, rbf):
        src, dst = edge_index
        msg = h.index_select(0, src) * self.filter(rbf)
        agg = torch.zeros_like(h).index_add_(0, dst, msg)
        return h + self.update(agg)


class EnergyNet(nn.Module):
    def __init__(self, hidden=32, basis=16, layers=2, cutoff=3.0):
        super().__init__()
        self.embed = nn.Embedding(MAX_Z, hidden)
        self.rbf = RadialBasis(basis, cutoff)
        self.layers = nn.ModuleList(Interaction(hidden, basis) for _ in range(layers))
        self.out = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, 1))

    def forward(self, z, edge_index, dist, batch, n_graphs):
        h = self.embed(z.long())
        rbf = self.rbf(dist)
        for layer in self.layers:
            h = layer(h, edge_index, rbf)
        atom_energy = self.out(h).squeeze(-1)
        return torch.zeros(n_graphs, dtype=atom_energy.dtype).index_add_(0, batch, atom_energy)


def per_structure_loss(pred, energy, natoms):
    """Squared error of the energy per atom, one value per structure."""
    return ((pred - energy) / natoms) ** 2
