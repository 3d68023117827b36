"""``dcnkit.nn.deformable_resnet``: which convolutions become deformable (mmdet's stage_with_dcn), weights
carried over, zero-initialised offsets so that the converted network computes what the original did."""
import copy

import pytest
import torch
import torch.nn as nn
import torchvision

from dcnkit.nn import DeformConv2dPack, ModulatedDeformConv2dPack, deformable_resnet


def _resnet(arch="resnet50", **kw):
    torch.manual_seed(0)
    m = getattr(torchvision.models, arch)(weights=None, **kw)
    # Non-trivial batch-norm statistics, so that eval outputs depend on every layer.
    for mod in m.modules():
        if isinstance(mod, nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.1, 0.1)
            mod.running_var.uniform_(0.5, 1.5)
    return m.eval()


def _dcn_names(model):
    return {n for n, m in model.named_modules() if isinstance(m, (DeformConv2dPack, ModulatedDeformConv2dPack))}


@pytest.mark.parametrize("modulated", [True, False])
def test_bottleneck_conv2_of_the_stages_become_deformable_and_outputs_are_unchanged(modulated):
    base = _resnet()
    model = deformable_resnet(copy.deepcopy(base), stages=(3, 4), modulated=modulated)
    cls = ModulatedDeformConv2dPack if modulated else DeformConv2dPack
    # mmdet's stage_with_dcn=(False, False, True, True): conv2 (the 3x3) of every Bottleneck in layer3, layer4.
    want = {f"layer{i}.{b}.conv2" for i, n in ((3, 6), (4, 3)) for b in range(n)}
    assert _dcn_names(model) == want
    for name in want:
        dcn, conv = model.get_submodule(name), base.get_submodule(name)
        assert type(dcn) is cls
        assert (dcn.stride, dcn.padding, dcn.dilation, dcn.groups) == (conv.stride, conv.padding, conv.dilation,
                                                                         conv.groups)
        assert dcn.bias is None
        torch.testing.assert_close(dcn.weight, conv.weight * (2 if modulated else 1), rtol=0, atol=0)
        assert torch.count_nonzero(dcn.conv_offset.weight) == 0 and torch.count_nonzero(dcn.conv_offset.bias) == 0
        assert dcn.conv_offset.out_channels == (27 if modulated else 18)
    # Other layers untouched (same objects' parameters).
    assert type(model.layer2[0].conv2) is nn.Conv2d and type(model.layer3[0].conv1) is nn.Conv2d
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(model(x), base(x), rtol=1e-4, atol=1e-4)


def test_dilated_and_grouped_convs_carry_over():
    # ResNeXt (groups 32) with a dilated layer4 (replace_stride_with_dilation).
    base = _resnet("resnext50_32x4d", replace_stride_with_dilation=[False, False, True])
    model = deformable_resnet(copy.deepcopy(base), stages=(4,))
    dcn = model.layer4[1].conv2
    assert isinstance(dcn, ModulatedDeformConv2dPack)
    assert dcn.groups == 32 and dcn.dilation == (2, 2) and dcn.padding == (2, 2)
    x = torch.randn(1, 3, 48, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), base(x), rtol=1e-4, atol=1e-4)


def test_basic_block_converts_both_3x3_convs_and_the_gradient_flows_to_offsets():
    base = _resnet("resnet18")
    model = deformable_resnet(copy.deepcopy(base), stages=[2])
    assert _dcn_names(model) == {f"layer2.{b}.conv{c}" for b in range(2) for c in (1, 2)}
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), base(x), rtol=1e-4, atol=1e-4)
    model.train()
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    assert model.layer2[0].conv1.conv_offset.weight.grad is not None
    assert model.layer2[0].conv1.conv_offset.weight.grad.abs().sum() > 0


def test_detector_backbone_body():
    from torchvision.models.detection import fasterrcnn_resnet50_fpn

    det = fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, num_classes=3)
    out = deformable_resnet(det)
    assert out is det
    assert _dcn_names(det) == {f"backbone.body.layer{i}.{b}.conv2" for i, n in ((3, 6), (4, 3)) for b in range(n)}


def test_frozen_weights_stay_frozen():
    base = _resnet()
    for p in base.layer3.parameters():
        p.requires_grad_(False)
    model = deformable_resnet(base, stages=(3,))
    assert not any(p.requires_grad for p in model.layer3[0].conv2.parameters())


@pytest.mark.parametrize("kwargs,exc,needle", [
    (dict(stages=(5,)), ValueError, "deformable_resnet: stages: expected ints in (1, 2, 3, 4) (layer1..layer4), got 5"),
    (dict(stages=()), ValueError, "deformable_resnet: stages: expected at least one stage"),
    (dict(stages=(3, 3)), ValueError, "deformable_resnet: stages: expected each stage once, got (3, 3)"),
    (dict(stages="34"), TypeError, "deformable_resnet: stages: expected a sequence of ints"),
    (dict(modulated=1), TypeError, "deformable_resnet: modulated: expected a bool, got int"),
])
def test_bad_arguments(kwargs, exc, needle):
    with pytest.raises(exc) as e:
        deformable_resnet(_resnet("resnet18"), **kwargs)
    assert needle in str(e.value)


def test_not_a_resnet_and_twice():
    with pytest.raises(ValueError, match=r"deformable_resnet: model: expected a torchvision ResNet .* got Sequential"):
        deformable_resnet(nn.Sequential(nn.Conv2d(3, 3, 3)))
    with pytest.raises(TypeError, match="deformable_resnet: model: expected a torch.nn.Module, got str"):
        deformable_resnet("resnet50")
    m = deformable_resnet(_resnet("resnet18"), stages=(4,))
    with pytest.raises(ValueError, match=r"layer4 has no 3x3 nn.Conv2d to convert"):
        deformable_resnet(m, stages=(4,))
