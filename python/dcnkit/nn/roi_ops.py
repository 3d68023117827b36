"""RoI pooling modules with mmcv's constructor arguments and parameter names (checkpoints load)."""
from __future__ import annotations

import importlib
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from dcnkit.ops._tracing import eager_call
from dcnkit.ops.roi_ops import _check_sampling, _pair, deform_psroi_pool, deform_roi_pool, roi_align

__all__ = ["RoIAlign", "DeformRoIPool", "DeformRoIPoolPack", "ModulatedDeformRoIPoolPack",
           "DeformPSRoIPool"]


def _check_input_channels(module: str, input: Tensor, output_channels: int) -> None:
    """The Pack modules' input has their output_channels channels (an fx leaf, like the ops)."""
    if not torch.jit.is_scripting():
        eager_call(_check_input_channels, _input_channels_check, (module, input, output_channels))
        return
    _input_channels_check(module, input, output_channels)


def _input_channels_check(module: str, input: Tensor, output_channels: int) -> None:
    if input.size(1) != output_channels:
        raise ValueError(f"{module}: input: expected {output_channels} channels (output_channels), "
                         f"got {input.size(1)}")


# torch.fx.symbolic_trace keeps these calls as single nodes (fx leaves).
torch.fx.wrap("roi_align")
torch.fx.wrap("deform_roi_pool")
torch.fx.wrap("deform_psroi_pool")
torch.fx.wrap("_check_input_channels")


class RoIAlign(nn.Module):
    """mmcv.ops.RoIAlign: forward(input (N, C, H, W), rois (K, 5)) -> (K, C, oh, ow).

    use_torchvision=True runs torchvision's roi_align operator instead (avg mode only), as mmcv does.
    """

    # A TorchScript constant: the torchvision branch is compiled only where it is taken.
    __constants__ = ["use_torchvision"]

    def __init__(self, output_size, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 pool_mode: str = "avg", aligned: bool = True, use_torchvision: bool = False):
        super().__init__()
        if pool_mode not in ("avg", "max"):
            raise ValueError(f"RoIAlign: pool_mode: expected 'avg' or 'max', got {pool_mode!r}")
        if use_torchvision and pool_mode != "avg":
            raise ValueError(f"RoIAlign: pool_mode: expected 'avg' with use_torchvision=True, got {pool_mode!r}")
        self.output_size = _pair(output_size, "RoIAlign: output_size")
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = _check_sampling("RoIAlign", "sampling_ratio", sampling_ratio)
        self.pool_mode = pool_mode
        self.aligned = bool(aligned)
        self.use_torchvision = bool(use_torchvision)
        if self.use_torchvision:
            importlib.import_module("torchvision")  # registers torch.ops.torchvision.roi_align

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        if self.use_torchvision:
            # What torchvision.ops.roi_align runs for a Tensor[K, 5] of boxes.
            return torch.ops.torchvision.roi_align(input, rois, self.spatial_scale, self.output_size[0],
                                                   self.output_size[1], self.sampling_ratio, self.aligned)
        return roi_align(input, rois, self.output_size, self.spatial_scale, self.sampling_ratio,
                         self.aligned, self.pool_mode)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, pool_mode={self.pool_mode}, "
                f"aligned={self.aligned}, use_torchvision={self.use_torchvision}")


class DeformRoIPool(nn.Module):
    """mmcv.ops.DeformRoIPool: forward(input, rois, offset=None) -> (K, C, oh, ow)."""

    def __init__(self, output_size, spatial_scale: float = 1.0, sampling_ratio: int = 0,
                 gamma: float = 0.1):
        super().__init__()
        self.output_size = _pair(output_size, "DeformRoIPool: output_size")
        self.spatial_scale = float(spatial_scale)
        self.sampling_ratio = _check_sampling(type(self).__name__, "sampling_ratio", sampling_ratio)
        self.gamma = float(gamma)

    def forward(self, input: Tensor, rois: Tensor, offset: Optional[Tensor] = None) -> Tensor:
        return deform_roi_pool(input, rois, offset, self.output_size, self.spatial_scale,
                               self.sampling_ratio, self.gamma)

    def extra_repr(self) -> str:
        return (f"output_size={self.output_size}, spatial_scale={self.spatial_scale}, "
                f"sampling_ratio={self.sampling_ratio}, gamma={self.gamma}")


class DeformRoIPoolPack(DeformRoIPool):
    """mmcv.ops.DeformRoIPoolPack: predicts the offsets from a first (offset-free) pooling with
    ``offset_fc``, whose last Linear starts at zero (so at first it equals plain pooling)."""

    def __init__(self, output_size, output_channels: int, deform_fc_channels: int = 1024,
                 spatial_scale: float = 1.0, sampling_ratio: int = 0, gamma: float = 0.1):
        super().__init__(output_size, spatial_scale, sampling_ratio, gamma)
        self.output_channels = int(output_channels)
        self.deform_fc_channels = int(deform_fc_channels)
        oh, ow = self.output_size
        self.offset_fc = nn.Sequential(
            nn.Linear(oh * ow * self.output_channels, self.deform_fc_channels),
            nn.ReLU(inplace=True),
            nn.Linear(self.deform_fc_channels, self.deform_fc_channels),
            nn.ReLU(inplace=True),
            nn.Linear(self.deform_fc_channels, oh * ow * 2),
        )
        nn.init.zeros_(self.offset_fc[-1].weight)
        nn.init.zeros_(self.offset_fc[-1].bias)

    def _offset(self, x: Tensor) -> Tensor:
        k = x.size(0)
        oh, ow = self.output_size
        return self.offset_fc(x.reshape(k, -1)).view(k, 2, oh, ow)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        _check_input_channels("DeformRoIPoolPack", input, self.output_channels)
        x = deform_roi_pool(input, rois, None, self.output_size, self.spatial_scale,
                            self.sampling_ratio, self.gamma)
        offset = self._offset(x)
        return deform_roi_pool(input, rois, offset, self.output_size, self.spatial_scale,
                               self.sampling_ratio, self.gamma)


class ModulatedDeformRoIPoolPack(DeformRoIPoolPack):
    """mmcv.ops.ModulatedDeformRoIPoolPack: DeformRoIPoolPack whose output is multiplied by a mask
    predicted by ``mask_fc`` (last Linear zero-initialised: the mask starts at sigmoid(0) = 0.5)."""

    def __init__(self, output_size, output_channels: int, deform_fc_channels: int = 1024,
                 spatial_scale: float = 1.0, sampling_ratio: int = 0, gamma: float = 0.1):
        super().__init__(output_size, output_channels, deform_fc_channels, spatial_scale,
                         sampling_ratio, gamma)
        oh, ow = self.output_size
        self.mask_fc = nn.Sequential(
            nn.Linear(oh * ow * self.output_channels, self.deform_fc_channels),
            nn.ReLU(inplace=True),
            nn.Linear(self.deform_fc_channels, oh * ow * 1),
            nn.Sigmoid(),
        )
        nn.init.zeros_(self.mask_fc[2].weight)
        nn.init.zeros_(self.mask_fc[2].bias)

    def forward(self, input: Tensor, rois: Tensor) -> Tensor:
        _check_input_channels("ModulatedDeformRoIPoolPack", input, self.output_channels)
        x = deform_roi_pool(input, rois, None, self.output_size, self.spatial_scale,
                            self.sampling_ratio, self.gamma)
        k = x.size(0)
        oh, ow = self.output_size
        offset = self._offset(x)
        mask = self.mask_fc(x.reshape(k, -1)).view(k, 1, oh, ow)
        d = deform_roi_pool(input, rois, offset, self.output_size, self.spatial_scale,
                            self.sampling_ratio, self.gamma)
        return d * mask


class DeformPSRoIPool(nn.Module):
    """Deformable position-sensitive RoI pooling (R-FCN; mmdet v1's DeformRoIPooling arguments).

    forward(input (N, output_dim * group_size^2, H, W), rois (K, 5), trans=None) -> (K, output_dim, P, P);
    trans is ignored when no_trans.
    """

    def __init__(self, spatial_scale: float, output_size: int, output_dim: int, group_size: int = 1,
                 part_size: Optional[int] = None, sample_per_part: int = 4, trans_std: float = 0.0,
                 no_trans: bool = False):
        super().__init__()
        self.spatial_scale = float(spatial_scale)
        self.output_size = int(output_size)
        self.output_dim = int(output_dim)
        self.group_size = int(group_size)
        self.part_size = self.output_size if part_size is None else int(part_size)
        self.sample_per_part = _check_sampling("DeformPSRoIPool", "sample_per_part", sample_per_part, 1)
        self.trans_std = float(trans_std)
        self.no_trans = bool(no_trans)

    def forward(self, input: Tensor, rois: Tensor, trans: Optional[Tensor] = None) -> Tensor:
        return deform_psroi_pool(input, rois, None if self.no_trans else trans, self.spatial_scale,
                                 self.output_size, self.output_dim, self.group_size, self.part_size,
                                 self.sample_per_part, self.trans_std)

    def extra_repr(self) -> str:
        return (f"spatial_scale={self.spatial_scale}, output_size={self.output_size}, "
                f"output_dim={self.output_dim}, group_size={self.group_size}, part_size={self.part_size}, "
                f"sample_per_part={self.sample_per_part}, trans_std={self.trans_std}, "
                f"no_trans={self.no_trans}")
