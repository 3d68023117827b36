"""Rotated RoIAlign (mmcv's ``roi_align_rotated``): ``torch.ops.dcnkit.roi_align_rotated``.

rois (K, 6) rows ``[batch_index, cx, cy, w, h, angle]``, the angle in radians, counter-clockwise in image space
(``clockwise=True`` turns it the other way). Each bin is sampled on a grid in the box's own frame, rotated about its
centre: ``y = yy*cos(a) - xx*sin(a) + cy``, ``x = yy*sin(a) + xx*cos(a) + cx``, with RoIAlign's border rules. See
docs/operators.md for the contract and for detectron2's ``ROIAlignRotated`` (degrees).

The kernel is C++/CUDA (declared once in plugins/core/ops/roi_align_rotated.cpp); this module adds the Python
signature, its fake kernels (``torch.compile`` / ``torch.export``) and its autograd formula.
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor
from torch.jit.annotations import BroadcastingList2

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops._tracing import eager_call
from dcnkit.ops.roi_ops import _output_size, register_input_grad_autograd

__all__ = ["roi_align_rotated"]


def roi_align_rotated(input: Tensor, rois: Tensor, output_size: BroadcastingList2[int], spatial_scale: float = 1.0,
                      sampling_ratio: int = 0, aligned: bool = True, clockwise: bool = False) -> Tensor:
    """mmcv's roi_align_rotated: input (N, C, H, W), rois (K, 6) [batch_index, cx, cy, w, h, angle (radians)]
    -> (K, C, oh, ow). sampling_ratio <= 0: adaptive, ceil(roi_size / output_size) samples per bin and axis."""
    if not torch.jit.is_scripting():
        return eager_call(roi_align_rotated, _roi_align_rotated,
                          (input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise))
    return _roi_align_rotated(input, rois, output_size, spatial_scale, sampling_ratio, aligned, clockwise)


def _roi_align_rotated(input: Tensor, rois: Tensor, output_size: List[int], spatial_scale: float,
                       sampling_ratio: int, aligned: bool, clockwise: bool) -> Tensor:
    oh, ow = _output_size(output_size, "roi_align_rotated: output_size")
    return torch.ops.dcnkit.roi_align_rotated(input, rois, oh, ow, float(spatial_scale), int(sampling_ratio),
                                              bool(aligned), bool(clockwise))


# torch.fx.symbolic_trace records calls to it as one node (an fx leaf).
torch.fx.wrap("roi_align_rotated")


@torch.library.register_fake("dcnkit::roi_align_rotated")
def _fake(input, rois, pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned, clockwise):
    torch._check(input.dim() == 4, lambda: "roi_align_rotated: input: expected a 4-D tensor")
    torch._check(rois.dim() == 2 and rois.size(1) == 6, lambda: "roi_align_rotated: rois: expected (K, 6)")
    return input.new_empty((rois.size(0), input.size(1), pooled_h, pooled_w))


@torch.library.register_fake("dcnkit::_roi_align_rotated_backward")
def _backward_fake(grad_output, input, rois, *attrs):
    return input.new_empty(input.shape)


register_input_grad_autograd("roi_align_rotated")
