"""``deformable_resnet``: deformable convolution in chosen stages of a torchvision ResNet (mmdet's
``stage_with_dcn``), in place, for a ResNet or a detector whose backbone body is one."""
from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn as nn

from dcnkit.nn.deform_conv import DeformConv2dPack, ModulatedDeformConv2dPack

__all__ = ["deformable_resnet"]

_STAGES = (1, 2, 3, 4)


def _body(model: nn.Module) -> nn.Module:
    """The module holding ``layer1`` .. ``layer4``: the model itself (``torchvision.models.ResNet``), its
    ``backbone.body`` (torchvision detectors: ``IntermediateLayerGetter`` over a ResNet) or its ``body``
    (``BackboneWithFPN``)."""
    candidates = [("model", model)]
    backbone = getattr(model, "backbone", None)
    if isinstance(backbone, nn.Module):
        body = getattr(backbone, "body", None)
        if isinstance(body, nn.Module):
            candidates.append(("model.backbone.body", body))
        candidates.append(("model.backbone", backbone))
    body = getattr(model, "body", None)
    if isinstance(body, nn.Module):
        candidates.append(("model.body", body))
    for _, c in candidates:
        if all(isinstance(getattr(c, f"layer{i}", None), nn.Module) for i in _STAGES):
            return c
    raise ValueError(
        "deformable_resnet: model: expected a torchvision ResNet or a model whose backbone.body (or body) is one "
        f"(modules layer1..layer4), got {type(model).__name__} without them")


def _check_stages(stages) -> tuple[int, ...]:
    if isinstance(stages, int) and not isinstance(stages, bool):
        stages = (stages,)
    if isinstance(stages, (str, bytes)) or not isinstance(stages, Iterable):
        raise TypeError(f"deformable_resnet: stages: expected a sequence of ints in {_STAGES}, "
                        f"got {type(stages).__name__}")
    stages = tuple(stages)
    bad = [s for s in stages if isinstance(s, bool) or not isinstance(s, int) or s not in _STAGES]
    if bad:
        raise ValueError(f"deformable_resnet: stages: expected ints in {_STAGES} (layer1..layer4), got {bad[0]!r}")
    if not stages:
        raise ValueError("deformable_resnet: stages: expected at least one stage, got an empty sequence")
    if len(set(stages)) != len(stages):
        raise ValueError(f"deformable_resnet: stages: expected each stage once, got {stages}")
    return stages


def _deformable(conv: nn.Conv2d, modulated: bool) -> nn.Module:
    cls = ModulatedDeformConv2dPack if modulated else DeformConv2dPack
    dcn = cls(conv.in_channels, conv.out_channels, conv.kernel_size, stride=conv.stride, padding=conv.padding,
              dilation=conv.dilation, groups=conv.groups, deform_groups=1, bias=conv.bias is not None)
    dcn = dcn.to(device=conv.weight.device, dtype=conv.weight.dtype)
    with torch.no_grad():
        # Zero offsets sample the regular grid. DCNv2's mask starts at sigmoid(0) = 0.5: the weight is stored
        # doubled (exact in floating point) so that the layer computes the original convolution at init.
        dcn.weight.copy_(conv.weight * 2 if modulated else conv.weight)
        if conv.bias is not None:
            dcn.bias.copy_(conv.bias)
        dcn.conv_offset.weight.zero_()
        dcn.conv_offset.bias.zero_()
    trainable = conv.weight.requires_grad
    for p in dcn.parameters():
        p.requires_grad_(trainable)
    dcn.train(conv.training)
    return dcn


def _is_convertible(m: nn.Module) -> bool:
    return (type(m) is nn.Conv2d and tuple(m.kernel_size) == (3, 3) and m.padding_mode == "zeros"
            and isinstance(m.padding, tuple))


def deformable_resnet(model: nn.Module, stages=(3, 4), modulated: bool = True) -> nn.Module:
    """Replaces the 3x3 convolutions of ResNet stages ``layer<i>`` for ``i`` in ``stages`` by deformable ones,
    as mmdet's ``ResNet(dcn=..., stage_with_dcn=...)`` does, in place; returns ``model``.

    ``model``: a ``torchvision.models.ResNet`` or a model whose ``backbone.body`` (torchvision's detectors) or
    ``body`` is one. ``stages``: layer numbers, ``(3, 4)`` = ``layer3``, ``layer4`` (ResNet's stages 4-5,
    mmdet's ``stage_with_dcn=(False, False, True, True)``). ``modulated``: DCNv2
    (:class:`~dcnkit.nn.ModulatedDeformConv2dPack`) or DCNv1 (:class:`~dcnkit.nn.DeformConv2dPack`).

    In a ``Bottleneck`` the 3x3 convolution is ``conv2`` (the one mmdet converts); in a ``BasicBlock``, which
    mmdet does not convert, both ``conv1`` and ``conv2``. Stride, padding, dilation, groups, bias, device, dtype,
    ``requires_grad`` and train/eval mode carry over; the offset (and mask) convolution ``conv_offset`` is
    zero-initialised, so the converted model computes what the original did until it is trained (DCNv2's
    weight is stored doubled to cancel its initial mask of 0.5).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"deformable_resnet: model: expected a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(modulated, bool):
        raise TypeError(f"deformable_resnet: modulated: expected a bool, got {type(modulated).__name__}")
    stages = _check_stages(stages)
    body = _body(model)
    for i in stages:
        layer = getattr(body, f"layer{i}")
        inside_dcn = [n for n, m in layer.named_modules() if isinstance(m, (DeformConv2dPack, ModulatedDeformConv2dPack))]
        targets = [(name, m) for name, m in layer.named_modules() if _is_convertible(m)
                   and not any(name.startswith(d + ".") for d in inside_dcn)]
        if not targets:
            raise ValueError(f"deformable_resnet: stages: layer{i} has no 3x3 nn.Conv2d to convert "
                             "(already deformable?)")
        for name, conv in targets:
            parent_name, _, attr = name.rpartition(".")
            parent = layer.get_submodule(parent_name) if parent_name else layer
            setattr(parent, attr, _deformable(conv, modulated))
    return model
