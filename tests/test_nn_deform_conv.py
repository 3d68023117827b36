"""dcnkit.nn deformable convolution modules: mmcv 2.x names, shapes, initialisation, checkpoints."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from dcnkit import reference
from dcnkit.nn import DeformConv2d, DeformConv2dPack, ModulatedDeformConv2d, ModulatedDeformConv2dPack


def _shapes(m):
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


def test_state_dict_names_and_shapes_like_mmcv():
    assert _shapes(DeformConv2d(8, 16, 3, padding=1, deform_groups=2)) == {"weight": (16, 8, 3, 3)}
    assert _shapes(DeformConv2d(8, 16, (3, 1), groups=4)) == {"weight": (16, 2, 3, 1)}
    assert _shapes(ModulatedDeformConv2d(8, 16, 3, groups=2)) == {"weight": (16, 4, 3, 3), "bias": (16,)}
    assert _shapes(ModulatedDeformConv2d(8, 16, 3, bias=False)) == {"weight": (16, 8, 3, 3)}
    assert _shapes(DeformConv2dPack(8, 16, 3, padding=1, deform_groups=2)) == {
        "weight": (16, 8, 3, 3), "conv_offset.weight": (36, 8, 3, 3), "conv_offset.bias": (36,)}
    assert _shapes(ModulatedDeformConv2dPack(8, 16, (3, 5), padding=(1, 2), deform_groups=2)) == {
        "weight": (16, 8, 3, 5), "bias": (16,), "conv_offset.weight": (90, 8, 3, 5), "conv_offset.bias": (90,)}


def test_attributes_like_mmcv():
    m = ModulatedDeformConv2dPack(4, 6, 3, stride=2, padding=1, dilation=2, groups=2, deformable_groups=2)
    assert (m.in_channels, m.out_channels, m.kernel_size, m.stride, m.padding, m.dilation) == (
        4, 6, (3, 3), (2, 2), (1, 1), (2, 2))
    assert (m.groups, m.deform_groups) == (2, 2)
    assert m.conv_offset.stride == (2, 2) and m.conv_offset.padding == (1, 1) and m.conv_offset.dilation == (2, 2)
    d = DeformConv2d(4, 6, 3, im2col_step=64)
    assert d.im2col_step == 64 and d.bias is None
    with pytest.raises(TypeError):
        DeformConv2d(4, 6, 3, nonsense=1)
    with pytest.raises(ValueError, match="deform_groups"):
        DeformConv2d(4, 6, 3, deform_groups=3)


def test_init_like_mmcv():
    torch.manual_seed(0)
    m = ModulatedDeformConv2dPack(16, 32, 3)
    stdv = 1.0 / math.sqrt(16 * 9)
    assert m.weight.abs().max() <= stdv
    assert m.weight.abs().max() > 0.9 * stdv  # uniform over the whole range, not a smaller one
    assert torch.equal(m.bias, torch.zeros(32))
    assert torch.equal(m.conv_offset.weight, torch.zeros_like(m.conv_offset.weight))
    assert torch.equal(m.conv_offset.bias, torch.zeros_like(m.conv_offset.bias))
    p = DeformConv2dPack(16, 32, 3)
    assert p.weight.abs().max() <= stdv
    assert torch.equal(p.conv_offset.weight, torch.zeros_like(p.conv_offset.weight))


@pytest.mark.parametrize("kwargs", [dict(), dict(stride=2, padding=1, dilation=1, groups=2, deform_groups=2),
                                    dict(padding=2, dilation=2)])
def test_pack_v1_starts_as_conv2d(kwargs):
    torch.manual_seed(1)
    m = DeformConv2dPack(4, 6, 3, **kwargs)
    x = torch.randn(2, 4, 9, 8, requires_grad=True)
    y = m(x)
    pad, st, dil = m.padding, m.stride, m.dilation
    x2 = x.detach().clone().requires_grad_()
    w2 = m.weight.detach().clone().requires_grad_()
    expected = F.conv2d(x2, w2, None, st, pad, dil, m.groups)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    # Gradients flow, and those of the input and weight are the convolution's.
    gy = torch.randn_like(y)
    y.backward(gy)
    expected.backward(gy)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(m.weight.grad, w2.grad, rtol=1e-4, atol=1e-4)
    assert m.conv_offset.weight.grad is not None and m.conv_offset.weight.grad.abs().sum() > 0


def test_pack_v2_starts_as_half_weight_conv2d():
    # Zero-initialised conv_offset: offsets 0 and mask sigmoid(0) = 0.5 (mmcv / DCNv2 paper).
    torch.manual_seed(2)
    m = ModulatedDeformConv2dPack(4, 6, 3, padding=1, deform_groups=2)
    with torch.no_grad():
        m.bias.copy_(torch.randn(6))
    x = torch.randn(2, 4, 7, 7, requires_grad=True)
    y = m(x)
    torch.testing.assert_close(y, F.conv2d(x, 0.5 * m.weight, m.bias, 1, 1), rtol=1e-5, atol=1e-5)
    y.square().sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, name
    assert x.grad.abs().sum() > 0


def test_modules_match_reference():
    torch.manual_seed(3)
    x = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    m = ModulatedDeformConv2d(4, 6, 3, padding=1, groups=2, deform_groups=2).double()
    with torch.no_grad():
        m.bias.normal_()
    off = torch.randn(2, 36, 6, 5, dtype=torch.float64)
    mask = torch.rand(2, 18, 6, 5, dtype=torch.float64)
    r = reference.deform_conv2d(x.numpy(), off.numpy(), m.weight.detach().numpy(), m.bias.detach().numpy(),
                                (1, 1), (1, 1), (1, 1), mask.numpy())
    np.testing.assert_allclose(m(x, off, mask).detach().numpy(), r, rtol=1e-10, atol=1e-10)
    d = DeformConv2d(4, 6, 3, stride=2, deform_groups=4).double()
    off1 = torch.randn(2, 72, 2, 2, dtype=torch.float64)
    r1 = reference.deform_conv2d(x.numpy(), off1.numpy(), d.weight.detach().numpy(), None, (2, 2), (0, 0), (1, 1))
    np.testing.assert_allclose(d(x, off1).detach().numpy(), r1, rtol=1e-10, atol=1e-10)


def test_pack_v2_splits_offset_and_mask_like_mmcv():
    torch.manual_seed(4)
    m = ModulatedDeformConv2dPack(3, 5, 3, padding=1).double()
    with torch.no_grad():
        m.conv_offset.weight.normal_(0, 0.3)
        m.conv_offset.bias.normal_()
    x = torch.randn(1, 3, 5, 6, dtype=torch.float64)
    out = m.conv_offset(x)
    o1, o2, mk = out[:, :9], out[:, 9:18], out[:, 18:]
    offset = torch.cat([o1, o2], 1)
    r = reference.deform_conv2d(x.numpy(), offset.detach().numpy(), m.weight.detach().numpy(),
                                m.bias.detach().numpy(), 1, 1, 1, torch.sigmoid(mk).detach().numpy())
    np.testing.assert_allclose(m(x).detach().numpy(), r, rtol=1e-10, atol=1e-10)


def test_roundtrip_state_dict():
    a = ModulatedDeformConv2dPack(4, 6, 3, padding=1)
    b = ModulatedDeformConv2dPack(4, 6, 3, padding=1)
    with torch.no_grad():
        a.conv_offset.weight.normal_()
    b.load_state_dict(a.state_dict())
    for k, v in a.state_dict().items():
        assert torch.equal(b.state_dict()[k], v), k


def test_load_old_conv_offset_mask_checkpoint():
    src = ModulatedDeformConv2dPack(4, 6, 3, padding=1)
    sd = {k.replace("conv_offset.", "conv_offset_mask."): torch.randn_like(v) for k, v in src.state_dict().items()}
    m = ModulatedDeformConv2dPack(4, 6, 3, padding=1)
    m.load_state_dict(sd)  # plain dict: no version metadata, like old checkpoints
    assert torch.equal(m.conv_offset.weight, sd["conv_offset_mask.weight"])
    assert torch.equal(m.conv_offset.bias, sd["conv_offset_mask.bias"])
    assert torch.equal(m.weight, sd["weight"])


def test_new_checkpoint_keys_win():
    m = ModulatedDeformConv2dPack(2, 2, 3, padding=1)
    sd = {k: torch.randn_like(v) for k, v in m.state_dict().items()}
    m.load_state_dict(sd)
    assert torch.equal(m.conv_offset.weight, sd["conv_offset.weight"])


def test_module_empty_batch_and_double():
    m = ModulatedDeformConv2dPack(3, 4, 3, padding=1).double()
    assert m(torch.zeros(0, 3, 5, 5, dtype=torch.float64)).shape == (0, 4, 5, 5)


# ---- a module's own deform_groups (mmcv raises when the offset or mask disagrees) -------------------


def test_offset_channels_must_match_deform_groups():
    x = torch.randn(1, 8, 6, 6)
    m = DeformConv2d(8, 8, 3, padding=1, deform_groups=2)
    with pytest.raises(ValueError, match=r"DeformConv2d: offset: expected 36 channels \(2 \* deform_groups \* kh "
                                         r"\* kw with deform_groups = 2, kernel 3x3\), got 18"):
        m(x, torch.zeros(1, 18, 6, 6))
    assert m(x, torch.zeros(1, 36, 6, 6)).shape == (1, 8, 6, 6)

    v2 = ModulatedDeformConv2d(8, 8, (3, 1), padding=(1, 0), deform_groups=1)
    with pytest.raises(ValueError, match=r"ModulatedDeformConv2d: offset: expected 6 channels .*"
                                         r"deform_groups = 1, kernel 3x1\), got 12"):
        v2(x, torch.zeros(1, 12, 6, 6), torch.zeros(1, 6, 6, 6))  # two groups' offset and mask
    with pytest.raises(ValueError, match=r"ModulatedDeformConv2d: mask: expected 3 channels \(deform_groups \* kh "
                                         r"\* kw with deform_groups = 1, kernel 3x1\), got 6"):
        v2(x, torch.zeros(1, 6, 6, 6), torch.zeros(1, 6, 6, 6))
    # The same checks inside TorchScript.
    with pytest.raises(torch.jit.Error, match=r"DeformConv2d: offset: expected 36 channels .*got 18"):
        torch.jit.script(m)(x, torch.zeros(1, 18, 6, 6))


def test_matching_deform_groups_compute_the_reference():
    g = torch.Generator().manual_seed(7)
    m = ModulatedDeformConv2d(8, 4, 3, padding=1, deform_groups=2).double()
    x = torch.randn(1, 8, 5, 5, generator=g, dtype=torch.float64)
    off = torch.randn(1, 36, 5, 5, generator=g, dtype=torch.float64)
    mask = torch.rand(1, 18, 5, 5, generator=g, dtype=torch.float64)
    expected = reference.deform_conv2d(x.numpy(), off.numpy(), m.weight.detach().numpy(), m.bias.detach().numpy(),
                                       (1, 1), (1, 1), (1, 1), mask.numpy())
    torch.testing.assert_close(m(x, off, mask), torch.from_numpy(expected), rtol=1e-12, atol=1e-12)
