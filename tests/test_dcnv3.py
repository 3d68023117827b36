"""dcnv3 / dcnv4 against the NumPy reference (dcnkit.reference) and the grid_sample formulation of InternImage's
pure-PyTorch core (tests/dcnv3_cases.py): values, gradients, DCNv4 = DCNv3 on the same data, softmax, gradcheck,
opcheck, torch.compile / torch.export, TorchScript / fx, non-finite offsets, bad input."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcnkit import reference as R
from dcnkit.ops import dcnv3, dcnv4

from dcnv3_cases import ATTRS, dcnv4_offset_mask, grid_sample_dcnv3, make_inputs

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")

# (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, group_channels, offset_scale)
ATTR_CASES = [ATTRS, (3, 3, 2, 1, 1, 0, 1, 2, 2, 3, 0.7), (5, 3, 1, 2, 2, 1, 2, 1, 1, 5, 1.3),
              (1, 1, 1, 1, 0, 0, 1, 1, 3, 2, 1.0),
              (3, 3, 1, 1, 1, 1, 1, 1, 2, 35, 0.9)]  # 35 channels a group: runs of 32 and 3 (the launch grid)


def _k(attrs, rc):
    return attrs[0] * attrs[1] - rc


@pytest.mark.parametrize("attrs", ATTR_CASES)
@pytest.mark.parametrize("rc", [0, 1])
def test_matches_numpy_reference_and_grid_sample(attrs, rc):
    if rc and attrs[0] * attrs[1] == 1:
        pytest.skip("a 1x1 kernel has no centre to remove")
    x, off, m = make_inputs(h=9, w=8, attrs=attrs, remove_center=rc, seed=1)
    y = dcnv3(x, off, m, *attrs, remove_center=rc)
    ref = R.dcnv3(x.numpy(), off.numpy(), m.numpy(), *attrs, remove_center=rc)
    np.testing.assert_allclose(y.numpy(), ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(y, grid_sample_dcnv3(x, off, m, *attrs, remove_center=rc), rtol=1e-12, atol=1e-12)
    x32, off32, m32 = (t.float() for t in (x, off, m))
    torch.testing.assert_close(dcnv3(x32, off32, m32, *attrs, remove_center=rc), y.float(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rc", [0, 1])
def test_gradients_match_grid_sample(rc):
    attrs = (3, 3, 2, 1, 1, 1, 1, 2, 2, 3, 0.8)
    x, off, m = make_inputs(h=8, w=7, attrs=attrs, remove_center=rc, seed=2)
    ours = [t.clone().requires_grad_() for t in (x, off, m)]
    theirs = [t.clone().requires_grad_() for t in (x, off, m)]
    y = dcnv3(*ours, *attrs, remove_center=rc)
    g = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    y.backward(g)
    grid_sample_dcnv3(*theirs, *attrs, remove_center=rc).backward(g)
    for a, b, name in zip(ours, theirs, ("input", "offset", "mask")):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10, msg=name)


@pytest.mark.parametrize("rc", [0, 1])
def test_dcnv4_is_dcnv3_on_the_same_data_and_its_padding_is_ignored(rc):
    attrs = ATTRS
    x, off, m = make_inputs(attrs=attrs, remove_center=rc, seed=4)
    k = _k(attrs, rc)
    om = dcnv4_offset_mask(off, m, attrs[8], k)
    assert om.shape[-1] % 8 == 0 and om.shape[-1] >= attrs[8] * 3 * k
    torch.testing.assert_close(dcnv4(x, om, *attrs, remove_center=rc), dcnv3(x, off, m, *attrs, remove_center=rc),
                               rtol=1e-12, atol=1e-12)
    # Gradients: DCNv3's, laid out as offset_mask; the padding channels get 0.
    xv, omv = x.clone().requires_grad_(), om.clone().requires_grad_()
    x3, o3, m3 = (t.clone().requires_grad_() for t in (x, off, m))
    dcnv4(xv, omv, *attrs, remove_center=rc).sum().backward()
    dcnv3(x3, o3, m3, *attrs, remove_center=rc).sum().backward()
    torch.testing.assert_close(xv.grad, x3.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(omv.grad, dcnv4_offset_mask(o3.grad, m3.grad, attrs[8], k).nan_to_num(posinf=0.0)
                               .where(torch.arange(om.shape[-1]) < attrs[8] * 3 * k, 0.0), rtol=1e-12, atol=1e-12)


def test_dcnv4_softmax_is_dcnv3_with_a_softmaxed_mask():
    attrs = ATTRS
    g, k = attrs[8], _k(attrs, 0)
    x, off, _ = make_inputs(attrs=attrs, seed=5)
    raw = torch.randn(off.shape[:3] + (g * k,), dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * 3
    soft = raw.reshape(*raw.shape[:3], g, k).softmax(-1).reshape(raw.shape)
    om = dcnv4_offset_mask(off, raw, g, k)
    torch.testing.assert_close(dcnv4(x, om, *attrs, softmax=True), dcnv3(x, off, soft, *attrs), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(dcnv4(x, om, *attrs, softmax=True).numpy(),
                               R.dcnv4(x.numpy(), om.numpy(), *attrs, softmax=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("softmax", [False, True])
def test_gradcheck(softmax):
    attrs = (3, 3, 1, 2, 1, 1, 1, 1, 2, 2, 0.9)
    x, off, m = make_inputs(n=1, h=5, w=6, attrs=attrs, seed=7)
    assert torch.autograd.gradcheck(lambda a, b, c: dcnv3(a, b, c, *attrs),
                                    [t.clone().requires_grad_() for t in (x, off, m)])
    om = dcnv4_offset_mask(off, m, 2, 9).clamp(-5, 5)
    assert torch.autograd.gradcheck(lambda a, b: dcnv4(a, b, *attrs, remove_center=0, softmax=softmax),
                                    [x.clone().requires_grad_(), om.requires_grad_()])


def test_opcheck():
    x, off, m = make_inputs(n=1, h=5, w=5, seed=8)
    torch.library.opcheck(torch.ops.dcnkit.dcnv3.default,
                          (x.requires_grad_(), off.requires_grad_(), m.requires_grad_(), *ATTRS, 0))
    om = dcnv4_offset_mask(off.detach(), m.detach(), 2, 9).clamp(-5, 5)
    torch.library.opcheck(torch.ops.dcnkit.dcnv4.default, (x.detach().requires_grad_(), om.requires_grad_(), *ATTRS, 0,
                                                           True))


def test_torch_compile_export_torchscript_fx():
    x, off, m = make_inputs(dtype=torch.float32, seed=9)

    class Layer(torch.nn.Module):
        def forward(self, x, off, m):
            return dcnv3(x, off, m, 3, 3, 1, 1, 1, 1, 1, 1, 2, 4, 1.0, 64, 0)

    eager = Layer()(x, off, m)
    compiled = torch.compile(Layer(), fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, off, m), eager)
    n = torch.export.Dim("n", min=1, max=64)
    ep = torch.export.export(Layer(), (x, off, m), dynamic_shapes=({0: n}, {0: n}, {0: n}))
    assert any("dcnv3" in str(node.target) for node in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x[:1], off[:1], m[:1]), eager[:1])
    torch.testing.assert_close(torch.jit.script(Layer())(x, off, m), eager)
    torch.testing.assert_close(torch.jit.trace(Layer(), (x, off, m))(x, off, m), eager)
    gm = torch.fx.symbolic_trace(Layer())
    assert [node.target for node in gm.graph.nodes if node.op == "call_function"] == [dcnv3]
    torch.testing.assert_close(gm(x, off, m), eager)


def test_non_finite_and_huge_offsets_are_zero_samples():
    x, off, m = make_inputs(seed=10)
    bad = off.clone()
    bad[0, 0, 0, 0] = math.nan
    bad[0, 1, 1, 2] = math.inf
    bad[1, 2, 2, 5] = 1e30
    bad[1, 0, 3, 6] = -1e30
    y = dcnv3(x, bad, m, *ATTRS)
    assert torch.isfinite(y).all()
    np.testing.assert_allclose(y.numpy(), R.dcnv3(x.numpy(), bad.numpy(), m.numpy(), *ATTRS), rtol=1e-12, atol=1e-12)
    leaves = [t.clone().requires_grad_() for t in (x, bad, m)]
    dcnv3(*leaves, *ATTRS).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in leaves)


def test_empty_batch_and_non_contiguous_inputs():
    x, off, m = make_inputs(seed=11)
    assert dcnv3(x[:0], off[:0], m[:0], *ATTRS).shape == (0, 7, 6, 8)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    assert not xt.is_contiguous()
    torch.testing.assert_close(dcnv3(xt, off, m, *ATTRS), dcnv3(x, off, m, *ATTRS))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_computes_in_float32(dtype):
    x, off, m = (t.to(dtype) for t in make_inputs(seed=12))
    y = dcnv3(x, off, m, *ATTRS)
    assert y.dtype == dtype
    torch.testing.assert_close(y, dcnv3(x.float(), off.float(), m.float(), *ATTRS).to(dtype))


def test_autocast_runs_in_float32():
    x, off, m = make_inputs(dtype=torch.float32)
    om = dcnv4_offset_mask(off, m, ATTRS[8], _k(ATTRS, 0)).float()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y3 = dcnv3(x.bfloat16(), off.bfloat16(), m.bfloat16(), *ATTRS)
        y4 = dcnv4(x.bfloat16(), om.bfloat16(), *ATTRS)
    assert y3.dtype == y4.dtype == torch.bfloat16
    expected = dcnv3(x.bfloat16().float(), off.bfloat16().float(), m.bfloat16().float(), *ATTRS)
    torch.testing.assert_close(y3.float(), expected, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(y4.float(), dcnv4(x.bfloat16().float(), om.bfloat16().float(), *ATTRS), rtol=1e-2,
                               atol=1e-2)


@settings(max_examples=15, deadline=None)
@given(kh=st.integers(1, 4), kw=st.integers(1, 4), s=st.integers(1, 2), p=st.integers(0, 2), d=st.integers(1, 2),
       g=st.integers(1, 3), gc=st.integers(1, 5), scale=st.floats(0.25, 2.0), seed=st.integers(0, 2**16))
def test_property_matches_grid_sample(kh, kw, s, p, d, g, gc, scale, seed):
    attrs = (kh, kw, s, s, p, p, d, d, g, gc, scale)
    h, w = d * (kh - 1) + 3, d * (kw - 1) + 4
    x, off, m = make_inputs(n=1, h=h, w=w, attrs=attrs, seed=seed)
    torch.testing.assert_close(dcnv3(x, off, m, *attrs), grid_sample_dcnv3(x, off, m, *attrs), rtol=1e-10,
                               atol=1e-10)


def test_bad_inputs_name_the_argument():
    x, off, m = make_inputs(seed=13)
    cases = [
        (lambda: dcnv3(x[..., :7], off, m, *ATTRS), r"dcnv3: input: expected C = group \* group_channels = 8"),
        (lambda: dcnv3(x, off[..., :-2], m, *ATTRS), r"dcnv3: offset: expected size 36 at dim 3"),
        (lambda: dcnv3(x, off, m[:, :2], *ATTRS), r"dcnv3: mask: expected size 7 at dim 1"),
        (lambda: dcnv3(x, off, m, 3, 3, 0, 1, 1, 1, 1, 1, 2, 4, 1.0), r"dcnv3: stride_h: expected an int in \[1, 2\^24\], got 0"),
        (lambda: dcnv3(x, off, m, 3, 3, 1, 1, -1, 1, 1, 1, 2, 4, 1.0), r"dcnv3: pad_h: expected an int in \[0, 2\^24\], got -1"),
        (lambda: dcnv3(x, off, m, 2, 3, 1, 1, 1, 1, 1, 1, 2, 4, 1.0, 256, 1),
         r"dcnv3: remove_center: expected odd kernel_h and kernel_w"),
        (lambda: dcnv3(x, off, m, *ATTRS[:-1], math.nan), r"dcnv3: offset_scale: expected a finite number"),
        (lambda: dcnv3(x, off.float(), m, *ATTRS), r"dcnv3: offset: expected dtype Double"),
        (lambda: dcnv3(x, off, m, *ATTRS, 0), r"dcnv3: im2col_step: expected an int >= 1, got 0"),
        (lambda: dcnv3(x[0], off, m, *ATTRS), r"dcnv3: input: expected 4-D tensor"),
        (lambda: dcnv4(x, off, *ATTRS), r"dcnv4: offset_mask: expected size 56 at dim 3 \(group \* K \* 3 = 54 "
                                        r"rounded up to a multiple of 8\)"),
        (lambda: dcnv4(x, off, *ATTRS, softmax=1), r"dcnv4: softmax: expected a bool, got 1"),
    ]
    for fn, pattern in cases:
        with pytest.raises((ValueError, TypeError, RuntimeError), match=pattern):
            fn()


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("softmax", [False, True])
def test_cuda_matches_cpu(dtype, softmax):
    x, off, m = make_inputs(dtype=dtype, seed=14)
    om = dcnv4_offset_mask(off, m, 2, 9).clamp(-5, 5)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    for fn, args in ((lambda *a: dcnv3(*a, *ATTRS), (x, off, m)),
                     (lambda *a: dcnv4(*a, *ATTRS, softmax=softmax), (x, om))):
        cpu = [t.clone().requires_grad_() for t in args]
        dev = [t.cuda().requires_grad_() for t in args]
        y, yd = fn(*cpu), fn(*dev)
        torch.testing.assert_close(yd.cpu(), y, rtol=tol, atol=tol)
        y.sum().backward()
        yd.sum().backward()
        for a, b in zip(dev, cpu):
            torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=tol * 10, atol=tol * 10)
