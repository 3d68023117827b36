"""dcnkit.ops.deform_conv2d (DCNv1 / DCNv2) against the NumPy reference of docs/operators.md and torchvision."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from dcnkit import reference
from dcnkit.ops import deform_conv2d

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

try:
    import torchvision.ops as tvops
except ImportError:  # pragma: no cover
    tvops = None

op = torch.ops.dcnkit.deform_conv2d
backward_op = torch.ops.dcnkit._deform_conv2d_backward


def _out(n, k, s, p, d):
    return (n + 2 * p - (d * (k - 1) + 1)) // s + 1


def make_inputs(n=2, cin=4, h=7, w=6, cout=6, kh=3, kw=3, stride=(1, 1), padding=(1, 1), dilation=(1, 1),
                groups=1, dgroups=1, modulated=True, bias=True, dtype=torch.float64, offset_scale=2.0,
                off_grid=False, seed=0, device="cpu"):
    """Random inputs; with off_grid, sampling points keep a fractional part in [0.15, 0.85] (gradcheck)."""
    g = torch.Generator().manual_seed(seed)
    ho, wo = _out(h, kh, stride[0], padding[0], dilation[0]), _out(w, kw, stride[1], padding[1], dilation[1])
    x = torch.randn(n, cin, h, w, generator=g, dtype=torch.float64)
    weight = torch.randn(cout, cin // groups, kh, kw, generator=g, dtype=torch.float64)
    b = torch.randn(cout, generator=g, dtype=torch.float64) if bias else None
    if off_grid:
        whole = torch.randint(-2, 3, (n, 2 * dgroups * kh * kw, ho, wo), generator=g).double()
        frac = 0.15 + 0.7 * torch.rand(n, 2 * dgroups * kh * kw, ho, wo, generator=g, dtype=torch.float64)
        offset = whole + frac
    else:
        offset = torch.randn(n, 2 * dgroups * kh * kw, ho, wo, generator=g, dtype=torch.float64) * offset_scale
    mask = torch.rand(n, dgroups * kh * kw, ho, wo, generator=g, dtype=torch.float64) if modulated else None
    conv = lambda t: None if t is None else t.to(dtype=dtype, device=device)  # noqa: E731
    return dict(input=conv(x), offset=conv(offset), weight=conv(weight), bias=conv(b), mask=conv(mask),
                stride=stride, padding=padding, dilation=dilation)


def run(a):
    return deform_conv2d(a["input"], a["offset"], a["weight"], a["bias"], a["stride"], a["padding"],
                         a["dilation"], a["mask"])


def ref(a):
    np_ = lambda t: None if t is None else t.detach().cpu().double().numpy()  # noqa: E731
    return reference.deform_conv2d(np_(a["input"]), np_(a["offset"]), np_(a["weight"]), np_(a["bias"]),
                                   a["stride"], a["padding"], a["dilation"], np_(a["mask"]))


CONFIGS = [
    # (n, cin, h, w, cout, kh, kw, stride, padding, dilation, groups, dgroups, modulated, bias)
    (2, 4, 7, 6, 6, 3, 3, (1, 1), (1, 1), (1, 1), 1, 1, True, True),
    (1, 6, 9, 7, 4, 3, 3, (2, 2), (1, 1), (2, 2), 2, 3, False, True),
    (3, 8, 10, 9, 8, 5, 3, (1, 2), (2, 1), (1, 1), 4, 2, True, False),
    (2, 4, 5, 5, 2, 1, 1, (1, 1), (0, 0), (1, 1), 1, 2, True, True),
    (1, 12, 6, 8, 6, 3, 3, (1, 1), (1, 1), (1, 1), 3, 2, True, True),  # dgroups span conv groups
    (2, 3, 4, 4, 3, 2, 2, (3, 1), (0, 2), (1, 2), 3, 1, False, False),
    (2, 4, 1, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 1, 1, True, True),  # one row (the CUDA scatter's 2 x 2 window
    (1, 2, 5, 1, 2, 3, 3, (1, 1), (1, 1), (1, 1), 1, 1, False, True),  # does not fit: the sorted path) / column
]


@pytest.mark.parametrize("cfg", CONFIGS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_forward_matches_reference(cfg, dtype):
    n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b = cfg
    a = make_inputs(n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b, dtype=dtype)
    y = run(a)
    assert y.dtype == dtype
    r = ref(a)
    assert y.shape == r.shape
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    np.testing.assert_allclose(y.double().numpy(), r, rtol=tol, atol=tol * np.abs(r).max())


@pytest.mark.skipif(tvops is None, reason="torchvision not installed")
@pytest.mark.parametrize("cfg", CONFIGS)
def test_matches_torchvision_fp32(cfg):
    n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b = cfg
    a = make_inputs(n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b, dtype=torch.float32, seed=3)
    y = run(a)
    yt = tvops.deform_conv2d(a["input"], a["offset"], a["weight"], a["bias"], s, p, d, a["mask"])
    torch.testing.assert_close(y, yt, rtol=1e-5, atol=1e-5 * yt.abs().max().item())


@pytest.mark.skipif(tvops is None, reason="torchvision not installed")
@pytest.mark.parametrize("cfg", CONFIGS[:3])
def test_backward_matches_torchvision(cfg):
    n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b = cfg
    a = make_inputs(n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b, dtype=torch.float64, seed=5)
    names = [k for k in ("input", "offset", "weight", "bias", "mask") if a[k] is not None]

    def grads(fn):
        leaves = {k: a[k].clone().requires_grad_() for k in names}
        kw_ = dict(a, **leaves)
        y = fn(kw_)
        gy = torch.linspace(-1, 1, y.numel(), dtype=y.dtype).reshape(y.shape)
        return torch.autograd.grad(y, [leaves[k] for k in names], gy)

    ours = grads(run)
    theirs = grads(lambda t: tvops.deform_conv2d(t["input"], t["offset"], t["weight"], t["bias"], s, p, d, t["mask"]))
    for k, x, y in zip(names, ours, theirs):
        torch.testing.assert_close(x, y, rtol=1e-9, atol=1e-9, msg=lambda m: f"grad {k}: {m}")


@pytest.mark.parametrize("modulated", [True, False])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cfg", [(1, 4, 5, 5, 4, 3, 3, (1, 1), (1, 1), (1, 1), 2, 2),
                                 (2, 2, 4, 5, 2, 2, 3, (2, 1), (1, 0), (1, 2), 1, 1)])
def test_gradcheck(cfg, modulated, bias):
    n, cin, h, w, cout, kh, kw, s, p, d, g, gd = cfg
    a = make_inputs(n, cin, h, w, cout, kh, kw, s, p, d, g, gd, modulated, bias, off_grid=True, seed=11)
    names = [k for k in ("input", "offset", "weight", "bias", "mask") if a[k] is not None]
    leaves = [a[k].clone().requires_grad_() for k in names]

    def f(*ts):
        t = dict(a, **dict(zip(names, ts)))
        return run(t)

    assert torch.autograd.gradcheck(f, leaves, eps=1e-6, atol=1e-6, rtol=1e-4)


@given(
    n=st.integers(0, 2),
    cin_g=st.integers(1, 3),
    groups=st.integers(1, 2),
    dgroups=st.integers(1, 2),
    cout_g=st.integers(1, 3),
    kh=st.integers(1, 3),
    kw=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    stride=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    padding=st.tuples(st.integers(0, 2), st.integers(0, 2)),
    dilation=st.tuples(st.integers(1, 2), st.integers(1, 2)),
    modulated=st.booleans(),
    bias=st.booleans(),
    scale=st.sampled_from([0.0, 0.7, 3.0]),
    seed=st.integers(0, 2**16),
)
def test_property_matches_reference(n, cin_g, groups, dgroups, cout_g, kh, kw, h, w, stride, padding, dilation,
                                    modulated, bias, scale, seed):
    cin = cin_g * groups * dgroups
    hypothesis.assume(_out(h, kh, stride[0], padding[0], dilation[0]) >= 1)
    hypothesis.assume(_out(w, kw, stride[1], padding[1], dilation[1]) >= 1)
    a = make_inputs(n, cin, h, w, cout_g * groups, kh, kw, stride, padding, dilation, groups, dgroups, modulated,
                    bias, offset_scale=scale, seed=seed)
    y = run(a)
    r = ref(a)
    assert y.shape == r.shape
    np.testing.assert_allclose(y.numpy(), r, rtol=1e-10, atol=1e-10)
    if n > 0:
        # Backward runs on every shape and gives finite gradients of the right shapes.
        leaves = {k: a[k].clone().requires_grad_() for k in ("input", "offset", "weight", "bias", "mask")
                  if a[k] is not None}
        out = run(dict(a, **leaves))
        out.sum().backward()
        for k, t in leaves.items():
            assert t.grad.shape == t.shape and torch.isfinite(t.grad).all(), k


# ---- torch.library integration -------------------------------------------------------------------


def _op_args(a, groups, dgroups):
    (sh, sw), (ph, pw), (dh, dw) = a["stride"], a["padding"], a["dilation"]
    return (a["input"], a["offset"], a["weight"], a["bias"], a["mask"], sh, sw, ph, pw, dh, dw, groups, dgroups)


@pytest.mark.parametrize("modulated,bias", [(True, True), (False, False), (True, False)])
def test_opcheck(modulated, bias):
    a = make_inputs(2, 4, 5, 6, 4, 3, 3, (1, 1), (1, 1), (1, 1), 2, 2, modulated, bias, off_grid=True)
    for k in ("input", "offset", "weight", "bias", "mask"):
        if a[k] is not None:
            a[k].requires_grad_()
    torch.library.opcheck(op, _op_args(a, 2, 2))
    gy = torch.randn(2, 4, 5, 6, dtype=torch.float64)
    torch.library.opcheck(backward_op, (gy,) + tuple(t.detach() if isinstance(t, torch.Tensor) else t
                                                     for t in _op_args(a, 2, 2)))


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.offset = torch.nn.Conv2d(3, 18, 3, padding=1)
        self.mask = torch.nn.Conv2d(3, 9, 3, padding=1)
        self.weight = torch.nn.Parameter(torch.randn(5, 3, 3, 3))
        self.bias = torch.nn.Parameter(torch.randn(5))

    def forward(self, x):
        return deform_conv2d(x, self.offset(x), self.weight, self.bias, 1, 1, 1, torch.sigmoid(self.mask(x)))


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph(backend):
    torch._dynamo.reset()
    net = _Net()
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    expected = net(x)
    (gx,) = torch.autograd.grad(expected.sum(), x)
    compiled = torch.compile(net, fullgraph=True, backend=backend)
    got = compiled(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    (gx2,) = torch.autograd.grad(got.sum(), x)
    torch.testing.assert_close(gx2, gx, rtol=1e-5, atol=1e-5)


def test_torch_export():
    net = _Net().eval()
    x = torch.randn(2, 3, 8, 8)
    ep = torch.export.export(net, (x,))
    assert any("dcnkit.deform_conv2d" in str(nd.target) for nd in ep.graph.nodes)
    torch.testing.assert_close(ep.module()(x), net(x))


# ---- edge cases ----------------------------------------------------------------------------------


def test_offsets_far_outside_give_bias():
    a = make_inputs(2, 4, 5, 5, 3, 3, 3, modulated=True, bias=True)
    a["offset"] = torch.full_like(a["offset"], 1e6)
    y = run(a)
    torch.testing.assert_close(y, a["bias"].view(1, -1, 1, 1).expand_as(y))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nan_inf_offsets_sample_as_outside(bad):
    a = make_inputs(2, 4, 5, 5, 3, 3, 3, modulated=True, bias=True, dtype=torch.float32)
    off = a["offset"].clone()
    off[:, ::3] = bad  # some y and x offsets
    a["offset"] = off
    y = run(a)
    assert torch.isfinite(y).all()
    np.testing.assert_allclose(y.double().numpy(), ref(a), rtol=1e-5, atol=1e-5)
    leaves = {k: a[k].clone().requires_grad_() for k in ("input", "weight", "bias", "mask")}
    run(dict(a, **leaves)).sum().backward()
    for k, t in leaves.items():
        assert torch.isfinite(t.grad).all(), k


@pytest.mark.parametrize("modulated", [True, False])
def test_empty_batch(modulated):
    a = make_inputs(0, 4, 5, 5, 3, 3, 3, modulated=modulated)
    leaves = {k: a[k].clone().requires_grad_() for k in ("input", "offset", "weight", "bias")}
    y = run(dict(a, **leaves))
    assert y.shape == (0, 3, 5, 5)
    y.sum().backward()
    assert leaves["input"].grad.shape == (0, 4, 5, 5)
    assert torch.equal(leaves["weight"].grad, torch.zeros_like(a["weight"]))
    assert torch.equal(leaves["bias"].grad, torch.zeros_like(a["bias"]))


def test_non_contiguous_inputs():
    a = make_inputs(2, 4, 6, 5, 4, 3, 3, modulated=True, dtype=torch.float32, seed=7)
    nc = {
        "input": a["input"].transpose(2, 3).contiguous().transpose(2, 3),
        "offset": torch.cat([a["offset"], a["offset"]], 1)[:, : a["offset"].shape[1]],
        "weight": a["weight"].permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2),
        "bias": torch.stack([a["bias"], a["bias"]], 1)[:, 0],
        "mask": a["mask"].to(memory_format=torch.channels_last),
    }
    assert not any(t.is_contiguous() for k, t in nc.items() if k != "mask")
    torch.testing.assert_close(run(dict(a, **nc)), run(a), rtol=0, atol=0)
    # Gradients too.
    leaves = {k: v.detach().requires_grad_() for k, v in nc.items()}
    run(dict(a, **leaves)).square().sum().backward()
    leaves2 = {k: a[k].clone().requires_grad_() for k in nc}
    run(dict(a, **leaves2)).square().sum().backward()
    for k in nc:
        torch.testing.assert_close(leaves[k].grad, leaves2[k].grad)


def test_v1_equals_v2_with_unit_mask():
    a = make_inputs(2, 4, 5, 5, 3, 3, 3, modulated=True)
    ones = dict(a, mask=torch.ones_like(a["mask"]))
    torch.testing.assert_close(run(ones), run(dict(a, mask=None)))


def test_zero_offsets_equal_conv2d():
    a = make_inputs(2, 6, 7, 8, 4, 3, 3, (2, 1), (1, 2), (1, 2), 2, 3, modulated=False)
    a["offset"] = torch.zeros_like(a["offset"])
    expected = torch.nn.functional.conv2d(a["input"], a["weight"], a["bias"], a["stride"], a["padding"],
                                          a["dilation"], groups=2)
    torch.testing.assert_close(run(a), expected)


def test_int_and_tuple_attributes():
    a = make_inputs(1, 2, 6, 6, 2, 3, 3, (2, 2), (1, 1), (1, 1))
    y1 = deform_conv2d(a["input"], a["offset"], a["weight"], a["bias"], 2, 1, 1, a["mask"])
    y2 = deform_conv2d(a["input"], a["offset"], a["weight"], a["bias"], (2, 2), [1, 1], (1, 1), a["mask"])
    torch.testing.assert_close(y1, y2)


def test_deterministic():
    a = make_inputs(2, 4, 6, 6, 4, 3, 3, modulated=True, dtype=torch.float32)

    def g():
        leaves = {k: a[k].clone().requires_grad_() for k in ("input", "offset", "weight", "bias", "mask")}
        run(dict(a, **leaves)).square().sum().backward()
        return [leaves[k].grad for k in leaves]

    for x, y in zip(g(), g()):
        assert torch.equal(x, y)


_ELEMENTWISE_CHILD = textwrap.dedent("""
    import sys, torch
    from dcnkit.ops import deform_conv2d
    cases = torch.load(sys.argv[1])
    out = []
    for a in cases:
        leaves = {k: a[k].clone().requires_grad_() for k in ("input", "offset", "weight", "bias", "mask")
                  if a[k] is not None}
        t = dict(a, **leaves)
        y = deform_conv2d(t["input"], t["offset"], t["weight"], t["bias"], t["stride"], t["padding"],
                          t["dilation"], t["mask"])
        y.backward(a["gy"])
        out.append({"y": y.detach(), **{k: v.grad for k, v in leaves.items()}})
    torch.save(out, sys.argv[2])
""")


@pytest.mark.parametrize("path", ["elementwise", "cuda-schedule", "cuda-schedule-int64", "cuda-schedule-deterministic"])
def test_elementwise_path_matches_fast_path(tmp_path, path):
    # DCNKIT_DCN_CPU_PATH=elementwise runs the CUDA kernels' per-element functions (im2col element,
    # atomic-style scatter, offset/mask gradient) on the CPU: the GPU math, checked here without a GPU.
    # DCNKIT_DCN_CPU_PATH=cuda-schedule runs the CUDA launchers themselves (their column tiles of two images or
    # of a third of an image's positions, every GEMM's arguments, their per-thread bodies over the launch grid:
    # the gather and the fused sampling backward, one thread per (image, group, channel slice, kernel point,
    # position), and the backward's fixed-order reduction over slices) with the CPU GEMM; -int64 runs the
    # 64-bit index instantiation of the same bodies; -deterministic the deterministic mode (grad_input by a plan,
    # a sort and a pixel gather, no scatter), checked against the atomic-style path through the same fast path.
    cases = []
    for i, cfg in enumerate(CONFIGS):
        n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b = cfg
        a = make_inputs(n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b, seed=40 + i, off_grid=(i % 2 == 0))
        a["gy"] = torch.randn(run(a).shape, dtype=torch.float64)
        cases.append(a)
    torch.save(cases, tmp_path / "in.pt")
    env = dict(os.environ, DCNKIT_DCN_CPU_PATH=path)
    subprocess.run([sys.executable, "-c", _ELEMENTWISE_CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                   env=env, check=True, timeout=300)
    got = torch.load(tmp_path / "out.pt")
    for a, o in zip(cases, got):
        np.testing.assert_allclose(o["y"].numpy(), ref(a), rtol=1e-10, atol=1e-10)
        leaves = {k: a[k].clone().requires_grad_() for k in ("input", "offset", "weight", "bias", "mask")
                  if a[k] is not None}
        y = run(dict(a, **leaves))
        y.backward(a["gy"])
        torch.testing.assert_close(o["y"], y.detach(), rtol=1e-12, atol=1e-12)
        for k, v in leaves.items():
            torch.testing.assert_close(o[k], v.grad, rtol=1e-10, atol=1e-10, msg=lambda m: f"grad {k}: {m}")


# ---- bad input -----------------------------------------------------------------------------------


def _bad(**over):
    a = make_inputs(2, 4, 5, 5, 4, 3, 3, modulated=True, dtype=torch.float32)
    a.update(over)
    return a


@pytest.mark.parametrize(
    "kwargs,exc,match",
    [
        (dict(input=torch.zeros(4, 5, 5)), ValueError, r"deform_conv2d: input: expected a 4-D tensor"),
        (dict(weight=torch.zeros(4, 4, 3)), ValueError, r"deform_conv2d: weight: expected a 4-D tensor"),
        (dict(offset=torch.zeros(2, 18, 5)), ValueError, r"deform_conv2d: offset: expected a 4-D tensor"),
        (dict(offset=torch.zeros(2, 17, 5, 5)), ValueError,
         r"deform_conv2d: offset: expected channels \(dim 1\) a positive multiple of 2\*kh\*kw = 18, got 17"),
        (dict(weight=torch.zeros(4, 3, 3, 3)), ValueError,
         r"deform_conv2d: weight: expected in-channels \(dim 1\) dividing the input channels 4, got 3"),
        (dict(offset=torch.zeros(2, 18 * 3, 5, 5), mask=None), ValueError,
         r"deform_conv2d: input: expected channels divisible by deformable_groups = 3, got 4 channels"),
        (dict(offset=torch.zeros(2, 18, 4, 5)), ValueError,
         r"deform_conv2d: offset: expected size 5 at dim 2 \(output height\), got 4"),
        (dict(offset=torch.zeros(2, 18, 5, 6)), ValueError,
         r"deform_conv2d: offset: expected size 5 at dim 3 \(output width\), got 6"),
        (dict(offset=torch.zeros(3, 18, 5, 5)), ValueError,
         r"deform_conv2d: offset: expected size 2 at dim 0 \(N of input\), got 3"),
        (dict(mask=torch.zeros(2, 8, 5, 5)), ValueError,
         r"deform_conv2d: mask: expected size 9 at dim 1 \(deformable_groups\*kh\*kw\), got 8"),
        (dict(mask=torch.zeros(1, 9, 5, 5)), ValueError, r"deform_conv2d: mask: expected size 2 at dim 0"),
        (dict(mask=torch.zeros(2, 9, 5, 4)), ValueError, r"deform_conv2d: mask: expected size 5 at dim 3"),
        (dict(mask=torch.zeros(2, 9, 25)), ValueError, r"deform_conv2d: mask: expected a 4-D tensor"),
        (dict(bias=torch.zeros(3)), ValueError,
         r"deform_conv2d: bias: expected size 4 at dim 0 \(Cout of weight\), got 3"),
        (dict(bias=torch.zeros(4, 1)), ValueError, r"deform_conv2d: bias: expected a 1-D tensor"),
        (dict(weight=torch.zeros(5, 2, 3, 3)), ValueError,
         r"deform_conv2d: weight: expected output channels \(dim 0\) divisible by groups = 2, got 5"),
        (dict(stride=(0, 1)), ValueError, r"deform_conv2d: stride: expected values >= 1, got \(0, 1\)"),
        (dict(padding=(1, -1)), ValueError, r"deform_conv2d: padding: expected values >= 0, got \(1, -1\)"),
        (dict(dilation=0), ValueError, r"deform_conv2d: dilation: expected values >= 1, got \(0, 0\)"),
        (dict(stride=(1, 2, 3)), ValueError, r"deform_conv2d: stride: expected an int or a pair of ints"),
        (dict(input=torch.zeros(2, 4, 1, 1), padding=0, offset=torch.zeros(2, 18, 1, 1)), ValueError,
         r"deform_conv2d: input: expected padded size .* at least the dilated kernel size \(3, 3\), got \(1, 1\)"),
        (dict(offset=torch.zeros(2, 18, 5, 5, dtype=torch.float64)), TypeError,
         r"deform_conv2d: offset: expected dtype Float \(the dtype of input\), got Double"),
        (dict(mask=torch.zeros(2, 9, 5, 5, dtype=torch.float64)), TypeError, r"deform_conv2d: mask: expected dtype"),
        (dict(bias=torch.zeros(4, dtype=torch.float64)), TypeError, r"deform_conv2d: bias: expected dtype"),
        (dict(weight=torch.zeros(4, 4, 3, 3, dtype=torch.float64)), TypeError, r"deform_conv2d: weight: expected dtype"),
        (dict(input=torch.zeros(2, 4, 5, 5, dtype=torch.int32)), TypeError,
         r"deform_conv2d: input: expected dtype float32, float64, float16 or bfloat16 \(CPU\), got Int"),
        # CPU float16 computes in float32, but every tensor still has input's dtype.
        (dict(input=torch.zeros(2, 4, 5, 5, dtype=torch.float16), weight=torch.zeros(4, 4, 3, 3, dtype=torch.float16),
              bias=None, mask=None), TypeError,
         r"deform_conv2d: offset: expected dtype Half \(the dtype of input\), got Float"),
    ],
)
def test_bad_input(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        run(_bad(**kwargs))


@pytest.mark.parametrize(
    "groups,dgroups,match",
    [
        (3, 1, r"deform_conv2d: input: expected channels divisible by groups = 3, got 4 channels"),
        (0, 1, r"deform_conv2d: groups: expected >= 1, got 0"),
        (1, 0, r"deform_conv2d: deformable_groups: expected >= 1, got 0"),
        (2, 1, r"deform_conv2d: weight: expected size 2 at dim 1 \(Cin/groups\), got 4"),
    ],
)
def test_bad_attributes_direct_op(groups, dgroups, match):
    a = make_inputs(2, 4, 5, 5, 4, 3, 3, dtype=torch.float32)
    with pytest.raises(ValueError, match=match):
        op(*_op_args(a, groups, dgroups))


def test_bad_grad_output_shape():
    a = make_inputs(2, 4, 5, 5, 4, 3, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"_deform_conv2d_backward: grad_output: expected shape \[2, 4, 5, 5\]"):
        backward_op(torch.zeros(2, 4, 5, 4, dtype=torch.float64), *_op_args(a, 1, 1))
    with pytest.raises(TypeError, match=r"_deform_conv2d_backward: grad_output: expected dtype Double"):
        backward_op(torch.zeros(2, 4, 5, 5), *_op_args(a, 1, 1))
