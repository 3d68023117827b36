"""``multi_level_roi_align``: the FPN pooler of two-stage detectors as one operator (mmdeploy's
``MMCVMultiLevelRoiAlign``). See docs/multi_level_roi_align.md for the exact contract.

The kernel is ``torch.ops.dcnkit.multi_level_roi_align`` (C++/CUDA, one pass over the RoIs); this module
registers its fake kernel (``torch.compile`` / ``torch.export``) and its autograd formula (gradients for
the feature maps, through ``_multi_level_roi_align_backward``).
"""
from __future__ import annotations

from typing import List

import torch
from torch import Tensor
from torch.jit.annotations import BroadcastingList2

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops._tracing import eager_call
from dcnkit.ops.roi_ops import _output_size, _quoted

__all__ = ["multi_level_roi_align", "MAX_FEATURE_LEVELS"]

# Feature maps the op takes at most (the core's kMaxFeatureLevels).
MAX_FEATURE_LEVELS = 8


@torch.jit.unused
def _check_eager(features, rois, featmap_strides) -> None:
    """The checks that only Python can fail (TorchScript has typed the arguments already)."""
    if not isinstance(features, (list, tuple)):
        raise ValueError(f"multi_level_roi_align: features: expected a list of Tensor (N, C, H, W), "
                         f"got {type(features).__name__}")
    for i, f in enumerate(features):
        if not isinstance(f, Tensor):
            raise ValueError(f"multi_level_roi_align: features[{i}]: expected a Tensor, got {type(f).__name__}")
    if not isinstance(rois, Tensor):
        raise ValueError(f"multi_level_roi_align: rois: expected a Tensor (K, 5), got {type(rois).__name__}")
    if not isinstance(featmap_strides, (list, tuple)):
        raise ValueError(f"multi_level_roi_align: featmap_strides: expected a list of floats, "
                         f"got {type(featmap_strides).__name__}")
    for i, s in enumerate(featmap_strides):
        if isinstance(s, bool) or not isinstance(s, (int, float)):
            raise ValueError(f"multi_level_roi_align: featmap_strides[{i}]: expected a number, got {s!r}")


def multi_level_roi_align(features: List[Tensor], rois: Tensor, output_size: BroadcastingList2[int],
                          featmap_strides: List[float], sampling_ratio: int = 0, finest_scale: int = 56,
                          roi_scale_factor: float = 1.0, aligned: bool = True, pool_mode: str = "avg") -> Tensor:
    """RoIAlign of every RoI on one of L feature maps, chosen by the RoI's size (mmdet / mmdeploy).

    features: L maps (N, C, H_l, W_l), finest first; rois: (K, 5) rows [batch_index, x1, y1, x2, y2] in
    image coordinates; returns (K, C, *output_size).

    Per RoI: level ``clamp(floor(log2(sqrt((x2-x1)*(y2-y1)) / finest_scale + 1e-6)), 0, L-1)`` from the box
    as given; when ``roi_scale_factor > 0`` the box is rescaled about its centre to half sizes
    ``(w+1)*roi_scale_factor/2 - 0.5`` (1.0 leaves it unchanged); then :func:`dcnkit.ops.roi_align` on that
    level with ``spatial_scale = 1 / featmap_strides[level]``, ``sampling_ratio``, ``aligned`` and
    ``pool_mode`` ("avg" | "max"). Gradients flow to the feature maps.
    """
    if not torch.jit.is_scripting():
        return eager_call(multi_level_roi_align, _multi_level_roi_align,
                          (features, rois, output_size, featmap_strides, sampling_ratio, finest_scale,
                           roi_scale_factor, aligned, pool_mode))
    return _multi_level_roi_align(features, rois, output_size, featmap_strides, sampling_ratio, finest_scale,
                                  roi_scale_factor, aligned, pool_mode)


def _multi_level_roi_align(features: List[Tensor], rois: Tensor, output_size: List[int],
                           featmap_strides: List[float], sampling_ratio: int, finest_scale: int,
                           roi_scale_factor: float, aligned: bool, pool_mode: str) -> Tensor:
    if not torch.jit.is_scripting():
        _check_eager(features, rois, featmap_strides)
    if pool_mode != "avg" and pool_mode != "max":
        raise ValueError(f"multi_level_roi_align: pool_mode: expected 'avg' or 'max', got {_quoted(pool_mode)}")
    # The level count, strides, maps and RoIs are checked once, by the kernel's core (same messages).
    strides: List[float] = []
    for s in featmap_strides:
        strides.append(float(s))
    oh, ow = _output_size(output_size, "multi_level_roi_align: output_size")
    return torch.ops.dcnkit.multi_level_roi_align(features, rois, oh, ow, strides, int(sampling_ratio),
                                                  int(finest_scale), float(roi_scale_factor), bool(aligned),
                                                  pool_mode)


# torch.fx.symbolic_trace records a call as one node (an fx leaf, like roi_align).
torch.fx.wrap("multi_level_roi_align")


@torch.library.register_fake("dcnkit::multi_level_roi_align")
def _multi_level_roi_align_fake(features, rois, pooled_h, pooled_w, featmap_strides, sampling_ratio, finest_scale,
                                roi_scale_factor, aligned, pool_mode):
    torch._check(len(features) >= 1, lambda: "multi_level_roi_align: features: expected at least one map")
    for f in features:
        torch._check(f.dim() == 4, lambda: "multi_level_roi_align: features: expected 4-D maps")
    torch._check(rois.dim() == 2 and rois.size(1) == 5, lambda: "multi_level_roi_align: rois: expected (K, 5)")
    return features[0].new_empty((rois.size(0), features[0].size(1), pooled_h, pooled_w))


@torch.library.register_fake("dcnkit::_multi_level_roi_align_backward")
def _multi_level_roi_align_backward_fake(grad_output, features, rois, pooled_h, pooled_w, featmap_strides,
                                         sampling_ratio, finest_scale, roi_scale_factor, aligned, pool_mode):
    return [f.new_empty(f.shape) for f in features]


def _setup(ctx, inputs, output):
    features, rois, *attrs = inputs
    ctx.num_levels = len(features)
    ctx.save_for_backward(rois, *features)
    ctx.attrs = attrs


def _backward(ctx, grad_output):
    rois, *features = ctx.saved_tensors
    grads = None
    if ctx.needs_input_grad[0]:
        grads = torch.ops.dcnkit._multi_level_roi_align_backward(grad_output, features, rois, *ctx.attrs)
    return (grads, None) + (None,) * len(ctx.attrs)


torch.library.register_autograd("dcnkit::multi_level_roi_align", _backward, setup_context=_setup)

