"""A small DCN network for tests/test_quantize_writers.py, as a ``dcnkit export`` factory
(``tests/quant_writers_model.py:build``): conv-BN-ReLU, a DCNv2 layer (offsets and mask predicted, no bias) with its
BatchNorm, conv-BN-ReLU, a strided conv, global pooling and a linear classifier. Its weights are seeded, so every
writer exports the same model. Two BatchNorms keep their initial statistics: their folded biases are the same zeros,
which torch's TorchScript exporter writes once, behind Identity nodes."""
from __future__ import annotations

import torch
from torch import nn

from dcnkit.nn import ModulatedDeformConv2dPack


def build(channels: int = 16) -> nn.Module:
    torch.manual_seed(0)
    c = channels
    m = nn.Sequential(
        nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
        ModulatedDeformConv2dPack(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
        nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
        nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * c, 10))
    with torch.no_grad():
        m[3].conv_offset.weight.normal_(0, 0.05)  # offsets and masks that matter
        m[3].conv_offset.bias.normal_(0, 0.5)
        bn = m[4]  # trained-like statistics behind the deformable convolution
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_(0, 0.2)
        bn.running_mean.normal_(0, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
    return m.eval()
