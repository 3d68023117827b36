"""Inputs of multi_scale_deformable_attn for the tests, and the operator written with torch's grid_sample (what
users run without a compiled op: every level a grid_sample of the value map at 2*loc - 1, weighted and summed),
built from docs/operators.md and differentiable by autograd."""
from __future__ import annotations

from typing import Sequence, Tuple

import torch
import torch.nn.functional as F


def level_tables(sizes: Sequence[Tuple[int, int]], device="cpu"):
    """spatial_shapes (L, 2) int64 and level_start_index (L,) int64 (prefix sums of H*W) of the levels."""
    shapes = torch.tensor(list(sizes), dtype=torch.int64, device=device).view(-1, 2)
    areas = shapes[:, 0] * shapes[:, 1]
    starts = torch.cat([areas.new_zeros(1), areas.cumsum(0)[:-1]])
    return shapes, starts


def make_inputs(n=2, sizes=((6, 5), (3, 4), (1, 2)), heads=3, channels=4, queries=7, points=2,
                dtype=torch.float64, seed=0, spread=0.2):
    """value, spatial_shapes, level_start_index, sampling_locations (some up to `spread` outside [0, 1]),
    attention_weights."""
    g = torch.Generator().manual_seed(seed)
    shapes, starts = level_tables(sizes)
    S = int((shapes[:, 0] * shapes[:, 1]).sum())
    L = len(sizes)
    value = torch.randn(n, S, heads, channels, generator=g, dtype=dtype)
    loc = torch.rand(n, queries, heads, L, points, 2, generator=g, dtype=dtype) * (1 + 2 * spread) - spread
    attn = torch.rand(n, queries, heads, L, points, generator=g, dtype=dtype)
    return value, shapes, starts, loc, attn


def grid_sample_msda(value, spatial_shapes, sampling_locations, attention_weights):
    """The pure-PyTorch formulation: per level, grid_sample(bilinear, zeros, align_corners=False) of the
    (N*M, D, H, W) map at grid 2*loc - 1, then the attention-weighted sum over levels and points."""
    N, S, M, D = value.shape
    _, Lq, _, L, P, _ = sampling_locations.shape
    sizes = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    levels = value.split([h * w for h, w in sizes], dim=1)
    grids = 2 * sampling_locations - 1
    samples = []
    for lvl, (h, w) in enumerate(sizes):
        v = levels[lvl].permute(0, 2, 3, 1).reshape(N * M, D, h, w)
        g = grids[:, :, :, lvl].transpose(1, 2).reshape(N * M, Lq, P, 2)
        samples.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    s = torch.stack(samples, dim=-2)  # (N*M, D, Lq, L, P)
    a = attention_weights.transpose(1, 2).reshape(N * M, 1, Lq, L, P)
    return (s * a).sum((-1, -2)).view(N, M * D, Lq).transpose(1, 2).contiguous()
