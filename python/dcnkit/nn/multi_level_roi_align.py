"""FPN RoI poolers over the fused ``multi_level_roi_align`` operator (one kernel, one ONNX node).

``MultiScaleRoIAlign``: a drop-in for ``torchvision.ops.MultiScaleRoIAlign`` (same arguments, same scale
inference and level mapping, same output), so ``model.roi_heads.box_roi_pool = MultiScaleRoIAlign(...)`` is all
a torchvision detector needs. ``MultiLevelRoIAlign``: mmdet's ``SingleRoIExtractor`` with a RoIAlign layer, by
mmdet's names.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
from torch import Tensor

import dcnkit.ops as _ops

__all__ = ["MultiScaleRoIAlign", "MultiLevelRoIAlign"]


def _pair(v, owner: str, name: str) -> Tuple[int, int]:
    if isinstance(v, int) and not isinstance(v, bool):
        v = (v, v)
    if (isinstance(v, (tuple, list)) and len(v) == 2
            and all(isinstance(i, int) and not isinstance(i, bool) and i > 0 for i in v)):
        return int(v[0]), int(v[1])
    raise ValueError(f"{owner}: {name}: expected a positive int or a pair (h, w) of them, got {v!r}")


def _infer_scale(feature: Tensor, original_size: Tuple[int, int]) -> float:
    """torchvision's ``_infer_scale``: the power of two nearest to feature size / image size (the height's)."""
    approx = float(feature.shape[-2]) / float(original_size[0])
    return 2 ** float(torch.tensor(approx).log2().round())


class MultiScaleRoIAlign(nn.Module):
    """Multi-scale RoIAlign as ``torchvision.ops.MultiScaleRoIAlign``, computed by one fused operator.

    Args (as torchvision's):
        featmap_names: names of the feature maps to pool from (taken in the order of ``x``'s keys).
        output_size: int or (h, w).
        sampling_ratio: samples per bin and axis; <= 0 adaptive.
        canonical_scale, canonical_level: FPN eq. 1: a ``canonical_scale`` x ``canonical_scale`` box is pooled
            from level ``canonical_level``.

    ``forward(x, boxes, image_shapes)``: ``x`` a dict of (N, C, Hi, Wi) maps, ``boxes`` a list of (Ki, 4) boxes
    (x1, y1, x2, y2) per image in image coordinates, ``image_shapes`` the (h, w) of the images; returns
    (sum Ki, C, h, w). As torchvision, the scales are inferred on the first call (power of two nearest to feature
    height / largest image height) and kept.

    Level mapping: torchvision takes ``floor(canonical_level + log2(sqrt(area) / canonical_scale) + 1e-6)``
    clamped to the pyramid's levels; the fused operator (mmdet's rule) ``floor(log2(sqrt(area) / finest_scale
    + 1e-6))`` clamped, with ``finest_scale = canonical_scale * 2 ** (k_min - canonical_level)`` (56 for
    torchvision's detectors). The two agree except for boxes whose ``log2(sqrt(area) / finest_scale)`` lies
    within about 1e-6 below an integer (torchvision adds its 1e-6 after the log, mmdet before), which may go
    one level up in one and not the other. Pooling is torchvision's: average, ``aligned=False``,
    ``spatial_scale`` the inferred scale.

    Differences from torchvision, both refused with an error: ``finest_scale`` must be a whole number (it is an
    int attribute of the operator), and the pooled maps must be consecutive pyramid levels (each half the size
    of the one before); torchvision's level index otherwise points past its maps and those boxes pool zeros.
    """

    def __init__(self, featmap_names: List[str], output_size: Union[int, Tuple[int], List[int]],
                 sampling_ratio: int, *, canonical_scale: int = 224, canonical_level: int = 4):
        super().__init__()
        owner = "MultiScaleRoIAlign"
        if isinstance(featmap_names, str) or not isinstance(featmap_names, Sequence) or not featmap_names \
                or not all(isinstance(n, str) for n in featmap_names):
            raise ValueError(f"{owner}: featmap_names: expected a non-empty list of str, got {featmap_names!r}")
        if isinstance(output_size, (list, tuple)) and len(output_size) == 1:
            output_size = output_size[0]
        if isinstance(sampling_ratio, bool) or not isinstance(sampling_ratio, int):
            raise ValueError(f"{owner}: sampling_ratio: expected an int, got {sampling_ratio!r}")
        for name, v in (("canonical_scale", canonical_scale), ("canonical_level", canonical_level)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
                    (name == "canonical_scale" and v <= 0):
                raise ValueError(f"{owner}: {name}: expected a {'positive ' if name == 'canonical_scale' else ''}"
                                 f"number, got {v!r}")
        self.featmap_names = list(featmap_names)
        self.output_size = _pair(output_size, owner, "output_size")
        self.sampling_ratio = int(sampling_ratio)
        self.canonical_scale = canonical_scale
        self.canonical_level = canonical_level
        self.scales: Optional[List[float]] = None
        self.finest_scale: Optional[int] = None

    def _setup(self, features: List[Tensor], image_shapes: List[Tuple[int, int]]) -> Tuple[List[float], int]:
        """(scales, finest_scale) as torchvision's ``_setup_scales`` infers them."""
        if not image_shapes:
            raise ValueError("MultiScaleRoIAlign: image_shapes: expected a non-empty list of (h, w), got []")
        original = (max(int(s[0]) for s in image_shapes), max(int(s[1]) for s in image_shapes))
        scales = [_infer_scale(f, original) for f in features]
        k_min = int(-math.log2(scales[0]))
        levels = [-math.log2(s) for s in scales]
        if len(scales) > 1 and any(b - a != 1 for a, b in zip(levels, levels[1:])):
            raise ValueError(
                "MultiScaleRoIAlign: x: expected consecutive pyramid levels (each map half the size of the one "
                f"before, scales 1/2**k), got scales {scales} for {self.featmap_names}")
        finest = self.canonical_scale * 2.0 ** (k_min - self.canonical_level)
        if finest != int(finest) or finest < 1:
            raise ValueError(
                "MultiScaleRoIAlign: canonical_scale: expected canonical_scale * 2**(k_min - canonical_level) to be "
                f"a whole number >= 1 (the operator's finest_scale), got {finest:g} (canonical_scale "
                f"{self.canonical_scale}, canonical_level {self.canonical_level}, k_min {k_min})")
        return scales, int(finest)

    def forward(self, x: Dict[str, Tensor], boxes: List[Tensor], image_shapes: List[Tuple[int, int]]) -> Tensor:
        owner = "MultiScaleRoIAlign"
        if not isinstance(x, dict):
            raise ValueError(f"{owner}: x: expected a dict of feature maps, got {type(x).__name__}")
        features = [v for k, v in x.items() if k in self.featmap_names]
        if not features:
            raise ValueError(f"{owner}: x: expected maps named among {self.featmap_names}, got keys {list(x)}")
        if not isinstance(boxes, (list, tuple)) or not boxes:
            got = "[]" if isinstance(boxes, (list, tuple)) else type(boxes).__name__
            raise ValueError(f"{owner}: boxes: expected a non-empty list of Tensor[K, 4] (one per image), got {got}")
        for i, b in enumerate(boxes):
            if not isinstance(b, Tensor) or b.dim() != 2 or b.size(1) != 4:
                got = list(b.shape) if isinstance(b, Tensor) else type(b).__name__
                raise ValueError(f"{owner}: boxes[{i}]: expected a Tensor[K, 4], got {got}")
        if self.scales is None:
            self.scales, self.finest_scale = self._setup(features, image_shapes)
        if len(self.scales) != len(features):
            raise ValueError(f"{owner}: x: expected {len(self.scales)} maps (as on the first call), "
                             f"got {len(features)}")
        rois = _boxes_to_rois(boxes)
        return _ops.multi_level_roi_align(
            features, rois, self.output_size, [1.0 / s for s in self.scales],
            sampling_ratio=self.sampling_ratio, finest_scale=self.finest_scale, roi_scale_factor=1.0,
            aligned=False, pool_mode="avg")

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(featmap_names={self.featmap_names}, "
                f"output_size={self.output_size}, sampling_ratio={self.sampling_ratio})")


def _boxes_to_rois(boxes: List[Tensor]) -> Tensor:
    """torchvision's ``_convert_to_roi_format``: (K, 5) rows [image index, x1, y1, x2, y2]."""
    concat = torch.cat(list(boxes), dim=0)
    ids = torch.cat([torch.full_like(b[:, :1], i) for i, b in enumerate(boxes)], dim=0)
    return torch.cat([ids, concat], dim=1)


class MultiLevelRoIAlign(nn.Module):
    """mmdet's ``SingleRoIExtractor(roi_layer=dict(type="RoIAlign", ...), featmap_strides, finest_scale)`` as
    one operator: each RoI is pooled from level ``clamp(floor(log2(sqrt(area) / finest_scale + 1e-6)), 0, L-1)``
    with ``spatial_scale = 1 / featmap_strides[level]``.

    Args (mmdet's names): ``output_size`` int or (h, w); ``featmap_strides`` one stride per level;
    ``sampling_ratio`` (0: adaptive); ``finest_scale`` (56); ``aligned`` (True, mmcv's default);
    ``pool_mode`` "avg" | "max".

    ``forward(feats, rois, roi_scale_factor=None)``: ``feats`` a sequence of L maps (N, C, Hi, Wi), ``rois``
    (K, 5) ``[batch_index, x1, y1, x2, y2]``; ``roi_scale_factor`` (as mmdet's) rescales each box about its
    centre after its level is chosen; returns (K, C, h, w).
    """

    def __init__(self, output_size: Union[int, Tuple[int, int]], featmap_strides: Sequence[float],
                 sampling_ratio: int = 0, finest_scale: int = 56, aligned: bool = True, pool_mode: str = "avg"):
        super().__init__()
        owner = "MultiLevelRoIAlign"
        self.output_size = _pair(output_size, owner, "output_size")
        if isinstance(featmap_strides, (str, bytes)) or not isinstance(featmap_strides, Sequence) \
                or not featmap_strides:
            raise ValueError(f"{owner}: featmap_strides: expected a non-empty sequence of strides > 0, "
                             f"got {featmap_strides!r}")
        for s in featmap_strides:
            if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
                raise ValueError(f"{owner}: featmap_strides: expected strides > 0, got {list(featmap_strides)}")
        if isinstance(sampling_ratio, bool) or not isinstance(sampling_ratio, int):
            raise ValueError(f"{owner}: sampling_ratio: expected an int, got {sampling_ratio!r}")
        if isinstance(finest_scale, bool) or not isinstance(finest_scale, int) or finest_scale < 1:
            raise ValueError(f"{owner}: finest_scale: expected an int >= 1, got {finest_scale!r}")
        if not isinstance(aligned, bool):
            raise ValueError(f"{owner}: aligned: expected a bool, got {aligned!r}")
        if pool_mode not in ("avg", "max"):
            raise ValueError(f"{owner}: pool_mode: expected 'avg' or 'max', got {pool_mode!r}")
        self.featmap_strides = [float(s) for s in featmap_strides]
        self.sampling_ratio = int(sampling_ratio)
        self.finest_scale = int(finest_scale)
        self.aligned = aligned
        self.pool_mode = pool_mode

    @property
    def num_inputs(self) -> int:
        """Number of levels (mmdet's ``SingleRoIExtractor.num_inputs``)."""
        return len(self.featmap_strides)

    def forward(self, feats: Sequence[Tensor], rois: Tensor, roi_scale_factor: Optional[float] = None) -> Tensor:
        owner = "MultiLevelRoIAlign"
        if isinstance(feats, Tensor) or not isinstance(feats, Sequence):
            raise ValueError(f"{owner}: feats: expected a sequence of {self.num_inputs} maps, "
                             f"got {type(feats).__name__}")
        if len(feats) != self.num_inputs:
            raise ValueError(f"{owner}: feats: expected {self.num_inputs} maps (one per featmap_strides), "
                             f"got {len(feats)}")
        return _ops.multi_level_roi_align(
            list(feats), rois, self.output_size, self.featmap_strides, sampling_ratio=self.sampling_ratio,
            finest_scale=self.finest_scale, roi_scale_factor=1.0 if roi_scale_factor is None else
            float(roi_scale_factor), aligned=self.aligned, pool_mode=self.pool_mode)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, featmap_strides={self.featmap_strides}, "
                f"sampling_ratio={self.sampling_ratio}, finest_scale={self.finest_scale}, "
                f"aligned={self.aligned}, pool_mode={self.pool_mode!r}")
