"""dcnkit modules, with mmcv's constructor arguments and parameter names (checkpoints load)."""
from dcnkit.nn.deform_conv import (
    DeformConv2d,
    DeformConv2dPack,
    ModulatedDeformConv2d,
    ModulatedDeformConv2dPack,
)
from dcnkit.nn.roi_ops import (
    DeformPSRoIPool,
    DeformRoIPool,
    DeformRoIPoolPack,
    ModulatedDeformRoIPoolPack,
    RoIAlign,
)

__all__ = [
    "DeformConv2d",
    "ModulatedDeformConv2d",
    "DeformConv2dPack",
    "ModulatedDeformConv2dPack",
    "RoIAlign",
    "DeformRoIPool",
    "DeformRoIPoolPack",
    "ModulatedDeformRoIPoolPack",
    "DeformPSRoIPool",
]
