"""The three deformable-attention cores of Hugging Face transformers, computed by
:func:`dcnkit.ops.multi_scale_deformable_attn` (one kernel call; one ONNX node when exported).

Each function keeps the signature and the result of the transformers code it stands in for:

- :func:`msda_module_forward`: ``MultiScaleDeformableAttention.forward(value, value_spatial_shapes,
  value_spatial_shapes_list, level_start_index, sampling_locations, attention_weights, im2col_step)`` (Deformable
  DETR, RT-DETR, Grounding DINO, MM-Grounding-DINO, OmDet-Turbo, LW-DETR): its tensors are the kit op's already.
- :func:`multi_scale_deformable_attention`: ``(value, value_spatial_shapes, sampling_locations,
  attention_weights)`` (Mask2Former, OneFormer), the level tables from the Python list of ``(H, W)``.
- :func:`multi_scale_deformable_attention_v2`: ``(value, value_spatial_shapes, sampling_locations,
  attention_weights, num_points_list, method)`` (RT-DETR v2, D-FINE, DEIMv2): the points of all levels concatenated
  (``(N, Lq, M, sum(num_points_list), 2)``), possibly a different count per level. ``method="discrete"`` (nearest
  pixel, clamped to the map) is computed exactly: every point is moved to the centre of the pixel transformers
  picks, where bilinear sampling returns that pixel's value.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from dcnkit.ops.msda import multi_scale_deformable_attn

__all__ = ["msda_module_forward", "multi_scale_deformable_attention", "multi_scale_deformable_attention_v2"]

_V2 = "multi_scale_deformable_attention_v2"


def _level_list(shapes: Any, name: str) -> list[tuple[Any, Any]]:
    """``[(H, W), ...]`` from transformers' list of pairs (or an (L, 2) tensor)."""
    if isinstance(shapes, Tensor):
        if shapes.dim() != 2 or shapes.size(1) != 2:
            raise ValueError(f"{name}: value_spatial_shapes: expected (L, 2) rows (H, W), got shape "
                             f"{tuple(shapes.shape)}")
        return [(h, w) for h, w in shapes.tolist()]
    try:
        levels = [(h, w) for h, w in shapes]
    except (TypeError, ValueError):
        raise ValueError(f"{name}: value_spatial_shapes: expected a list of (H, W) pairs, got {shapes!r}") from None
    if not levels:
        raise ValueError(f"{name}: value_spatial_shapes: expected at least one level, got none")
    return levels


def _level_tables(levels: Sequence[tuple[Any, Any]], device: torch.device) -> tuple[Tensor, Tensor]:
    """The kit op's int64 ``spatial_shapes (L, 2)`` and ``level_start_index (L,)`` from Python sizes (constants
    of an exported graph, as transformers' own Python list makes its split sizes)."""
    starts, total = [], 0
    for h, w in levels:
        starts.append(total)
        total = total + h * w
    shapes = torch.tensor([[h, w] for h, w in levels], dtype=torch.int64, device=device)
    return shapes, torch.tensor(starts, dtype=torch.int64, device=device)


def msda_module_forward(self, value: Tensor, value_spatial_shapes: Tensor, value_spatial_shapes_list: Any,
                        level_start_index: Tensor, sampling_locations: Tensor, attention_weights: Tensor,
                        im2col_step: int = 64) -> Tensor:
    """transformers' ``MultiScaleDeformableAttention.forward``: (N, Lq, M*D), on the kit's op."""
    if value_spatial_shapes.dtype != torch.int64:
        value_spatial_shapes = value_spatial_shapes.to(torch.int64)
    if level_start_index.dtype != torch.int64:
        level_start_index = level_start_index.to(torch.int64)
    return multi_scale_deformable_attn(value, value_spatial_shapes, level_start_index, sampling_locations,
                                       attention_weights)


def multi_scale_deformable_attention(value: Tensor, value_spatial_shapes: Any, sampling_locations: Tensor,
                                     attention_weights: Tensor) -> Tensor:
    """transformers' ``multi_scale_deformable_attention`` (Mask2Former, OneFormer) on the kit's op."""
    levels = _level_list(value_spatial_shapes, "multi_scale_deformable_attention")
    shapes, starts = _level_tables(levels, value.device)
    return multi_scale_deformable_attn(value, shapes, starts, sampling_locations, attention_weights)


def _discrete_locations(locations: Tensor, levels: Sequence[tuple[Any, Any]], counts: Sequence[int]) -> Tensor:
    """transformers' ``method="discrete"`` picks pixel ``clamp(int64(x*W + 0.5), 0, W-1)`` (likewise y) of each
    point's level: the centre of that pixel, ``(i + 0.5) / W``, is where the kit's bilinear sampling (at
    ``x*W - 0.5``) returns exactly that pixel's value. No gradient reaches the locations, as in transformers
    (its int64 cast)."""
    wh = torch.tensor([[float(w), float(h)] for (h, w), c in zip(levels, counts) for _ in range(c)],
                      dtype=locations.dtype, device=locations.device)
    pixel = (locations.detach() * wh + 0.5).trunc()  # the int64 cast truncates toward zero
    pixel = torch.minimum(pixel.clamp_min(0.0), wh - 1.0)
    return (pixel + 0.5) / wh


def multi_scale_deformable_attention_v2(value: Tensor, value_spatial_shapes: Any, sampling_locations: Tensor,
                                        attention_weights: Tensor, num_points_list: Sequence[int],
                                        method: str = "default") -> Tensor:
    """transformers' ``multi_scale_deformable_attention_v2`` (RT-DETR v2, D-FINE, DEIMv2) on the kit's op.

    Levels with fewer points than the most are padded with points of weight 0 placed outside the map (they add
    exactly 0, and get no gradient)."""
    if method not in ("default", "discrete"):
        raise ValueError(f"{_V2}: method: expected 'default' or 'discrete', got {method!r}")
    levels = _level_list(value_spatial_shapes, _V2)
    counts = [int(c) for c in num_points_list]
    if len(counts) != len(levels) or any(c < 1 for c in counts):
        raise ValueError(f"{_V2}: num_points_list: expected {len(levels)} counts >= 1 (one per level), got "
                         f"{list(num_points_list)!r}")
    if sampling_locations.dim() != 5 or sampling_locations.size(-1) != 2:
        raise ValueError(f"{_V2}: sampling_locations: expected (N, Lq, M, sum(num_points_list), 2), got shape "
                         f"{tuple(sampling_locations.shape)}")
    n, lq, m, total, _ = sampling_locations.shape
    if total != sum(counts):
        raise ValueError(f"{_V2}: sampling_locations: expected sum(num_points_list) = {sum(counts)} points, got "
                         f"{total}")
    if method == "discrete":
        sampling_locations = _discrete_locations(sampling_locations, levels, counts)
    num_levels, most = len(counts), max(counts)
    if all(c == most for c in counts):
        locations = sampling_locations.reshape(n, lq, m, num_levels, most, 2)
        weights = attention_weights.reshape(n, lq, m, num_levels, most)
    else:
        loc_parts, w_parts = [], []
        for loc, w, c in zip(sampling_locations.split(counts, dim=3), attention_weights.split(counts, dim=3), counts):
            if c < most:
                loc = torch.nn.functional.pad(loc, (0, 0, 0, most - c), value=-1.0)
                w = torch.nn.functional.pad(w, (0, most - c), value=0.0)
            loc_parts.append(loc)
            w_parts.append(w)
        locations = torch.stack(loc_parts, dim=3)
        weights = torch.stack(w_parts, dim=3)
    shapes, starts = _level_tables(levels, value.device)
    return multi_scale_deformable_attn(value, shapes, starts, locations, weights)
