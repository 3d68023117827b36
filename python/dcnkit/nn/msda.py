"""``MultiScaleDeformableAttention``: Deformable DETR's attention layer with mmcv's constructor arguments,
parameter names and shapes (``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj``), its
weight initialisation and its ``forward`` signature, so mmcv / mmdet checkpoints load with ``strict=True``.
The sampling runs on :func:`dcnkit.ops.multi_scale_deformable_attn` on every device (one ONNX node when
exported).
"""
from __future__ import annotations

import math
import warnings
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

import dcnkit.ops as _ops

__all__ = ["MultiScaleDeformableAttention"]

_NAME = "MultiScaleDeformableAttention"


def _positive_int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{_NAME}: {name}: expected an int >= 1, got {v!r}")
    return v


def _last_dim(t: Tensor) -> int:
    """t's last size as an int. It picks the graph's structure (points or boxes), so under torch.jit.trace (the
    legacy ONNX exporter) it is a constant, as intended: the TracerWarning saying so is silenced."""
    if torch.jit.is_tracing():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            return int(t.shape[-1])
    return int(t.shape[-1])


# Keywords mmcv's / mmdet's transformer layers pass to every attention and mmcv's module does not use.
_UNUSED_KEYWORDS = ("key_pos", "attn_mask", "valid_ratios")


def _mmcv_keywords(identity: Optional[Tensor], kwargs: dict) -> Optional[Tensor]:
    """mmcv's meaning of forward's extra keywords: ``residual`` is the deprecated ``identity`` (mmcv's
    deprecated_api_warning maps it with a warning and refuses both at once); _UNUSED_KEYWORDS are ignored; any
    other keyword is a TypeError (never silently dropped)."""
    unknown = sorted(set(kwargs) - {"residual", *_UNUSED_KEYWORDS})
    if unknown:
        raise TypeError(f"{_NAME}.forward: unexpected keyword argument(s) {', '.join(map(repr, unknown))} "
                        f"(accepted and unused, as in mmcv: {', '.join(_UNUSED_KEYWORDS)}; residual is identity)")
    if "residual" not in kwargs:
        return identity
    if identity is not None:
        raise TypeError(f"{_NAME}.forward: residual: the deprecated name of identity, expected one of the two, got "
                        "both")
    warnings.warn(f'"residual" is deprecated in `{_NAME}.forward`, please use "identity" instead (as mmcv)',
                  stacklevel=3)
    return kwargs["residual"]


class MultiScaleDeformableAttention(nn.Module):
    """Multi-scale deformable attention (Zhu et al., Deformable DETR), as mmcv's module of that name.

    Args (mmcv's): embed_dims (256), num_heads (8), num_levels (4), num_points (4), im2col_step (64, no
    effect on the result), dropout (0.1, on the output before the residual), batch_first (False: queries
    (Lq, N, C)), norm_cfg and init_cfg (accepted, unused), value_proj_ratio (1.0: value_proj's output width
    is ``int(embed_dims * value_proj_ratio)``).

    ``forward(query, key=None, value=None, identity=None, query_pos=None, key_padding_mask=None,
    reference_points=None, spatial_shapes=None, level_start_index=None, **kwargs)`` returns
    ``dropout(output_proj(attention)) + identity`` shaped like ``query``. ``reference_points`` is
    (N, Lq, L, 2) points or (N, Lq, L, 4) boxes (cx, cy, w, h), normalised to [0, 1]. The other keywords are
    mmcv's: ``residual=`` is the deprecated name of ``identity=`` (a warning, as mmcv), ``key``, ``key_pos``,
    ``attn_mask`` and ``valid_ratios`` (what mmcv's / mmdet's transformer layers pass) are accepted and unused, as
    in mmcv; any other keyword is a TypeError.
    """

    def __init__(self, embed_dims: int = 256, num_heads: int = 8, num_levels: int = 4, num_points: int = 4,
                 im2col_step: int = 64, dropout: float = 0.1, batch_first: bool = False,
                 norm_cfg: Optional[dict] = None, init_cfg=None, value_proj_ratio: float = 1.0):
        super().__init__()
        embed_dims = _positive_int(embed_dims, "embed_dims")
        num_heads = _positive_int(num_heads, "num_heads")
        if embed_dims % num_heads != 0:
            raise ValueError(f"{_NAME}: embed_dims: expected a multiple of num_heads = {num_heads}, got {embed_dims}")
        dim_per_head = embed_dims // num_heads
        if dim_per_head & (dim_per_head - 1) != 0:
            warnings.warn(f"{_NAME}: embed_dims / num_heads = {dim_per_head} is not a power of 2 "
                          "(mmcv's CUDA kernel is most efficient with one); the result is the same")
        self.norm_cfg = norm_cfg
        self.init_cfg = init_cfg
        self.dropout = nn.Dropout(dropout)
        self.batch_first = bool(batch_first)
        self.im2col_step = _positive_int(im2col_step, "im2col_step")
        self.embed_dims = embed_dims
        self.num_levels = _positive_int(num_levels, "num_levels")
        self.num_heads = num_heads
        self.num_points = _positive_int(num_points, "num_points")
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_levels * num_points)
        value_proj_size = int(embed_dims * value_proj_ratio)
        if value_proj_size < 1 or value_proj_size % num_heads != 0:
            raise ValueError(f"{_NAME}: value_proj_ratio: expected int(embed_dims * value_proj_ratio) a positive "
                             f"multiple of num_heads = {num_heads}, got {value_proj_size}")
        self.value_proj = nn.Linear(embed_dims, value_proj_size)
        self.output_proj = nn.Linear(value_proj_size, embed_dims)
        self.init_weights()

    def init_weights(self) -> None:
        """mmcv's initialisation: zero offset weights with biases pointing each head at one direction of a
        circle (k-th point k times as far), zero attention weights (uniform after the softmax), and
        Xavier-uniform projections with zero biases."""
        nn.init.constant_(self.sampling_offsets.weight, 0.0)
        device = self.sampling_offsets.weight.device
        thetas = torch.arange(self.num_heads, dtype=torch.float32, device=device) * (2.0 * math.pi / self.num_heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(self.num_heads, 1, 1, 2)
        grid = grid.repeat(1, self.num_levels, self.num_points, 1)
        for i in range(self.num_points):
            grid[:, :, i, :] *= i + 1
        with torch.no_grad():
            self.sampling_offsets.bias.copy_(grid.view(-1))
        nn.init.constant_(self.attention_weights.weight, 0.0)
        nn.init.constant_(self.attention_weights.bias, 0.0)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.constant_(proj.bias, 0.0)

    def forward(self, query: Tensor, key: Optional[Tensor] = None, value: Optional[Tensor] = None,
                identity: Optional[Tensor] = None, query_pos: Optional[Tensor] = None,
                key_padding_mask: Optional[Tensor] = None, reference_points: Optional[Tensor] = None,
                spatial_shapes: Optional[Tensor] = None, level_start_index: Optional[Tensor] = None,
                **kwargs) -> Tensor:
        identity = _mmcv_keywords(identity, kwargs)
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if reference_points is None or spatial_shapes is None or level_start_index is None:
            raise ValueError(f"{_NAME}: reference_points, spatial_shapes and level_start_index: expected tensors, "
                             f"got {type(reference_points).__name__}, {type(spatial_shapes).__name__} and "
                             f"{type(level_start_index).__name__}")
        if not self.batch_first:
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        bs, num_query, _ = query.shape
        _, num_value, _ = value.shape
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.view(bs, num_value, self.num_heads, -1)
        h, l, p = self.num_heads, self.num_levels, self.num_points
        offsets = self.sampling_offsets(query).view(bs, num_query, h, l, p, 2)
        weights = self.attention_weights(query).view(bs, num_query, h, l * p).softmax(-1)
        weights = weights.view(bs, num_query, h, l, p)
        ref_dim = _last_dim(reference_points)
        if ref_dim == 2:
            # Offsets are in pixels of each level: divide by (W_l, H_l).
            normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1).to(offsets.dtype)
            locations = reference_points[:, :, None, :, None, :] + offsets / normalizer[None, None, None, :, None, :]
        elif ref_dim == 4:
            locations = (reference_points[:, :, None, :, None, :2]
                         + offsets / p * reference_points[:, :, None, :, None, 2:] * 0.5)
        else:
            raise ValueError(f"{_NAME}: reference_points: expected a last dim of 2 (points) or 4 (boxes), "
                             f"got shape {tuple(reference_points.shape)}")
        output = _ops.multi_scale_deformable_attn(value, spatial_shapes, level_start_index, locations, weights,
                                                  self.im2col_step)
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity
