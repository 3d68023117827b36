"""mmcv's RoIAlignRotated module (the RoI extractor of rotated detectors: mmrotate's Oriented R-CNN and RoI
Transformer), with mmcv's constructor arguments."""
from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from dcnkit.ops.roi_align_rotated import roi_align_rotated
from dcnkit.ops.roi_ops import _check_sampling, _pair

__all__ = ["RoIAlignRotated"]

torch.fx.wrap("roi_align_rotated")


class RoIAlignRotated(nn.Module):
    """mmcv.ops.RoIAlignRotated: forward(input (N, C, H, W), rois (K, 6) [batch_index, cx, cy, w, h, angle]) ->
    (K, C, oh, ow); the angle in radians."""

    def __init__(self, output_size, spatial_scale: float = 1.0, sampling_ratio: int = 0, aligned: bool = True,
                 clockwise: bool = False):
        super().__init__()
        self.output_size = _pair(output_size, "RoIAlignRotated: output_size")
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = _check_sampling("RoIAlignRotated", "sampling_ratio", sampling_ratio)
        self.aligned = bool(aligned)
        self.clockwise = bool(clockwise)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        return roi_align_rotated(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                                 self.aligned, self.clockwise)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, aligned={self.aligned}, clockwise={self.clockwise}")
