"""dcnkit operators for PyTorch (drop-in for torchvision.ops / mmcv.ops signatures).

All four are ``torch.library`` operators in the ``dcnkit`` namespace with fake kernels and autograd,
so ``torch.compile(fullgraph=True)``, ``torch.export`` and ``torch.library.opcheck`` work.
"""
from dcnkit.ops import _loader  # noqa: F401  (loads libdcnkit_torch.so)
from dcnkit.ops.deform_conv import deform_conv2d
from dcnkit.ops.roi_ops import deform_psroi_pool, deform_roi_pool, roi_align

__all__ = ["deform_conv2d", "roi_align", "deform_roi_pool", "deform_psroi_pool"]
