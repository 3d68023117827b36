"""dcnkit modules, with mmcv's constructor arguments and parameter names (checkpoints load); FPN RoI poolers
(torchvision's ``MultiScaleRoIAlign`` drop-in, mmdet's extractor as ``MultiLevelRoIAlign``) and
``deformable_resnet`` (mmdet's ``stage_with_dcn`` for torchvision ResNets)."""
from dcnkit.nn.dcnv3 import DCNv3, DCNv4
from dcnkit.nn.deform_conv import (
    DeformConv2d,
    DeformConv2dPack,
    ModulatedDeformConv2d,
    ModulatedDeformConv2dPack,
)
from dcnkit.nn.msda import MultiScaleDeformableAttention
from dcnkit.nn.multi_level_roi_align import MultiLevelRoIAlign, MultiScaleRoIAlign
from dcnkit.nn.resnet import deformable_resnet
from dcnkit.nn.roi_align_rotated import RoIAlignRotated
from dcnkit.nn.roi_ops import (
    DeformPSRoIPool,
    DeformRoIPool,
    DeformRoIPoolPack,
    ModulatedDeformRoIPoolPack,
    RoIAlign,
)

__all__ = [
    "DCNv3",
    "DCNv4",
    "DeformConv2d",
    "ModulatedDeformConv2d",
    "DeformConv2dPack",
    "ModulatedDeformConv2dPack",
    "RoIAlign",
    "DeformRoIPool",
    "DeformRoIPoolPack",
    "ModulatedDeformRoIPoolPack",
    "DeformPSRoIPool",
    "MultiScaleRoIAlign",
    "MultiLevelRoIAlign",
    "deformable_resnet",
]
__all__ += ["MultiScaleDeformableAttention", "RoIAlignRotated"]
