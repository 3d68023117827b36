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

Each gives ``value``'s gradient the memory layout transformers' code gives it for a batch of one (the v2 stand-in
through :func:`_like_transformers`), so that the model's own backward kernels upstream of the attention see the same
tensors as in the original model.
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


_TABLES: dict[tuple[Any, ...], tuple[Tensor, Tensor]] = {}
_TABLES_MAX = 64  # distinct (levels, device) kept; more (many image sizes) empty the cache


def _level_tables(levels: Sequence[tuple[Any, Any]], device: torch.device) -> tuple[Tensor, Tensor]:
    """The kit op's int64 ``spatial_shapes (L, 2)`` and ``level_start_index (L,)`` from Python sizes (constants
    of an exported graph, as transformers' own Python list makes its split sizes).

    In eager mode they are built once per (levels, device) and reused: on a GPU each build is a host-to-device copy
    from pageable memory, which waits for the work queued before it (it was one such wait per attention layer)."""
    key = None
    if all(type(n) is int for hw in levels for n in hw) and not torch.jit.is_tracing() \
            and not torch.compiler.is_compiling():
        key = (tuple(levels), device)
        cached = _TABLES.get(key)
        if cached is not None:
            return cached
    if any(isinstance(n, Tensor) for hw in levels for n in hw):
        # Sizes that are tensors (a trace of a dynamic-shape export reads feature maps' sizes so): the tables are
        # computed from them, and the exported graph computes them at run time.
        shapes = torch.stack([torch.stack([torch.as_tensor(n, device=device).reshape(()) for n in hw])
                              for hw in levels]).to(torch.int64)
        areas = shapes[:, 0] * shapes[:, 1]
        return shapes, torch.cumsum(areas, 0) - areas
    starts, total = [], 0
    for h, w in levels:
        starts.append(total)
        total = total + h * w
    # Normal tensors even under torch.inference_mode(): the op saves them for a later backward.
    with torch.inference_mode(False):
        shapes = torch.tensor([[h, w] for h, w in levels], dtype=torch.int64, device=device)
        tables = shapes, torch.tensor(starts, dtype=torch.int64, device=device)
    if key is not None:
        if len(_TABLES) >= _TABLES_MAX:
            _TABLES.clear()
        _TABLES[key] = tables
    return tables


class _GradLayout(torch.autograd.Function):
    """The identity on ``value`` (N, S, M, D); its backward returns the gradient with the strides of a
    ``(N, M, D, S)``-contiguous tensor, the layout of the gradient that transformers' grid_sample code gives
    ``value`` (the kit's backward returns a contiguous one)."""

    @staticmethod
    def forward(ctx, value: Tensor) -> Tensor:
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)


def _like_transformers(value: Tensor) -> Tensor:
    """``value``, through :class:`_GradLayout` when a gradient is taken (not while tracing or exporting: an
    identity there). transformers' v2 function gives value's gradient the (N, M, D, S) layout of its
    ``value.permute(0, 2, 3, 1)``, whatever the batch and levels; the module and the v1 function give a contiguous one
    for a batch of one (as the kit's backward), and for larger batches one that depends on the level shapes.

    The layout matters beyond rounding: PyTorch's CPU batch-norm backward (2.14) reads a batch-1 ``grad_output``
    that is channels-last with a batch stride other than H*W*C as if it were NCHW. The flattened feature maps' (1, S,
    C) gradient, when contiguous, reaches a model's BatchNorm layers in that layout: D-FINE's and DEIMv2's encoder
    gradients came out wrong in the patched model and not in the original."""
    if value.requires_grad and torch.is_grad_enabled() and not torch.jit.is_tracing() \
            and not torch.compiler.is_exporting():
        return _GradLayout.apply(value)
    return value


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
    return multi_scale_deformable_attn(_like_transformers(value), shapes, starts, locations, weights)
