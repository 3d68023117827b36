"""dcnkit operators for PyTorch (drop-in for torchvision.ops / mmcv.ops signatures).

All are ``torch.library`` operators in the ``dcnkit`` namespace with fake kernels, autograd and
autocast kernels, so ``torch.compile(fullgraph=True)``, ``torch.export``, ``torch.library.opcheck`` and AMP
work. The Python wrappers script (``torch.jit.script``) and are ``torch.fx`` leaves; CPU float16/bfloat16
compute in float32.
"""
import torch as _torch

from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops.dcnv3 import dcnv3, dcnv4
from dcnkit.ops.deform_conv import deform_conv2d
from dcnkit.ops.msda import multi_scale_deformable_attn
from dcnkit.ops.multi_level_roi_align import multi_level_roi_align
from dcnkit.ops.roi_align_rotated import roi_align_rotated
from dcnkit.ops.roi_ops import deform_psroi_pool, deform_roi_pool, roi_align

__all__ = ["deform_conv2d", "roi_align", "deform_roi_pool", "deform_psroi_pool", "multi_level_roi_align"]
__all__ += ["multi_scale_deformable_attn", "dcnv3", "dcnv4", "roi_align_rotated"]

# Calls through this package's names (dcnkit.ops.roi_align(...)) are fx leaves too.
_torch.fx.wrap("deform_conv2d")
_torch.fx.wrap("roi_align")
_torch.fx.wrap("deform_roi_pool")
_torch.fx.wrap("deform_psroi_pool")
_torch.fx.wrap("multi_level_roi_align")
_torch.fx.wrap("multi_scale_deformable_attn")
_torch.fx.wrap("dcnv3")
_torch.fx.wrap("dcnv4")
_torch.fx.wrap("roi_align_rotated")
