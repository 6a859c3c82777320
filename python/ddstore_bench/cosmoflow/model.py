"""The CosmoFlow-like benchmark's model: a small 3D CNN in CosmoFlow's shape (blocks of
convolution, leaky ReLU and 2x max pooling, then fully connected layers
regressing the 4 targets), sized to train on CPUs.

The input transform (int16 counts to log1p floats, CosmoFlow's `apply_log`)
is the model's first step, not the loader's, so that every loader hands the
model the same raw rows and the loading time of each is the reading alone.

The loss of a rank's local batch is summed over its samples and scaled by
ranks / global batch (local_loss_sum): DDP averages gradients over ranks, so
the update is then the mean over the global batch whatever the deal, also
when SOLAR's re-dealing gives ranks local batches of different sizes.
"""

import torch
from torch import nn

__all__ = ["CosmoCNN", "per_sample_loss", "local_loss_sum"]


class CosmoCNN(nn.Module):
    """Conv blocks (channels 8, 16, 16, ...) halving the cube until it is
    4^3 (or smaller), global average pooling, then 32 -> 4 outputs."""

    def __init__(self, size, channels=4, targets=4, widths=(8, 16, 16)):
        super().__init__()
        layers, c, s, i = [], channels, size, 0
        while s > 4:
            w = widths[min(i, len(widths) - 1)]
            layers += [nn.Conv3d(c, w, 3, padding=1), nn.LeakyReLU(), nn.MaxPool3d(2)]
            c, s, i = w, s // 2, i + 1
        layers += [nn.AdaptiveAvgPool3d(1), nn.Flatten(), nn.Linear(c, 32), nn.LeakyReLU(), nn.Linear(32, targets)]
        self.layers = nn.Sequential(*layers)

    def forward(self, x):
        return self.layers(torch.log1p(x.float()))


def per_sample_loss(out, y):
    """Mean squared error of each sample over its targets: shape (batch,)."""
    return ((out - y) ** 2).mean(dim=1)


def local_loss_sum(losses, ranks, global_batch):
    """What a rank back-propagates: its samples' losses summed, times
    ranks / global batch, so that DDP's average over ranks is the global
    batch's mean loss."""
    return losses.sum() * (ranks / global_batch)
