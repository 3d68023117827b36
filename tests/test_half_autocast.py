"""float16 / bfloat16: CPU tensors (computed in float32 at the op boundary) and torch.autocast.

- CPU float16/bfloat16, every op, forward and every gradient (offsets, masks and trans included): the result
  is float64 on the same rounded inputs, within the output dtype's rounding. The bound is
  u * |ref| + 1e-5 * max|ref| (u: the dtype's unit roundoff 2^-11 / 2^-8; the second term is float32
  arithmetic, 50x / 400x below a half-ulp of the largest value), which a kernel computing in float16 misses.
- torch.autocast("cpu", bfloat16 / float16): forward and backward work; float32 tensors give exactly the
  float32 results, a reduced-precision input gives the float32 computation rounded to its dtype.
- Autocast never reaches the GEMM inside the kernels: the CUDA launch schedule on the CPU with ATen's GEMM
  (DCNKIT_DCN_CPU_PATH=cuda-schedule, DCNKIT_NO_DIRECT_BLAS=1) gives the float32 result under CPU autocast,
  with and without bias, through the autocast kernel, the kernel itself and the backward op.
- CUDA: autocast float16/bfloat16 forward and backward (skipped without a GPU).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from dcnkit import nn as dnn
from dcnkit import reference as R
from dcnkit.ops import deform_conv2d, deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align

from conftest import HAS_CUDA
from test_roi_align import rand_rois

REDUCED = [pytest.param(torch.float16, id="float16"), pytest.param(torch.bfloat16, id="bfloat16")]
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
_NP = lambda t: None if t is None else t.detach().double().numpy()  # noqa: E731


def assert_rounded(got, ref, dtype, what):
    """got (dtype) is ref (float64) rounded to dtype, up to float32 arithmetic."""
    assert got.dtype == dtype, f"{what}: dtype {got.dtype}"
    ref = torch.as_tensor(ref, dtype=torch.float64)
    err = (got.double() - ref).abs()
    bound = UNIT_ROUNDOFF[dtype] * ref.abs() + 1e-5 * ref.abs().max() + 1e-30
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{what}: error {err.max().item():.3g} exceeds the {dtype} rounding bound ({worst:.2f}x)"


# ---- the four ops as (function of the differentiable tensors, their float64 values, NumPy forward) -----


def _multi_level_np(f0, rr, f1):
    """NumPy reference of the multi-level case: docs/operators.md's level rule (finest_scale 2, strides 2 and 4), then
    RoIAlign (avg, aligned, ratio 2, output 3x2) on the chosen map."""
    maps, strides = [f0, f1], [2.0, 4.0]
    s = np.sqrt((rr[:, 3] - rr[:, 1]) * (rr[:, 4] - rr[:, 2]))
    lvl = np.clip(np.nan_to_num(np.floor(np.log2(s / 2 + 1e-6)), nan=0.0), 0, 1).astype(int)
    return np.concatenate([R.roi_align(maps[lv], rr[k:k + 1], (3, 2), 1.0 / strides[lv], 2, True, "avg")
                           for k, lv in enumerate(lvl)])


def _cases(gen):
    """name -> (fn(*tensors) -> output, float64 tensors (each rounded later), NumPy reference of fn)."""
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    n, cin, h, w, cout = 2, 8, 7, 6, 6
    ho, wo = 4, 3  # stride 2, padding 1, 3x3 kernel
    # Offsets keep a fractional part in [0.15, 0.85]: sampling points stay off the integer grid, where
    # the offset gradient jumps, so float32 and float64 see the same bilinear cell.
    whole = torch.randint(-2, 3, (n, 2 * 2 * 9, ho, wo), generator=gen).double()
    off = whole + 0.15 + 0.7 * torch.rand(n, 2 * 2 * 9, ho, wo, generator=gen, dtype=torch.float64)
    dcn = dict(stride=(2, 2), padding=(1, 1), dilation=(1, 1))
    rois = rand_rois(5, 2, 2 * h, 2 * w, inside=True, gen=gen)
    x_roi = r(2, 8, 9, 8)

    def dcn_fn(x, offset, weight, bias, mask):
        return deform_conv2d(x, offset, weight, bias, mask=mask, **dcn)

    return {
        "deform_conv2d": (
            dcn_fn,
            [r(n, cin, h, w), off, r(cout, cin // 2, 3, 3), r(cout),
             torch.rand(n, 2 * 9, ho, wo, generator=gen, dtype=torch.float64)],
            lambda x, o, wt, b, m: R.deform_conv2d(x, o, wt, b, (2, 2), (1, 1), (1, 1), m),
        ),
        "roi_align": (
            lambda x, rr: roi_align(x, rr, (3, 2), 0.5, 2, True),
            [x_roi, rois],
            lambda x, rr: R.roi_align(x, rr, (3, 2), 0.5, 2, True, "avg"),
        ),
        "roi_align_max": (
            lambda x, rr: roi_align(x, rr, 2, 0.5, 2, False, "max"),
            [x_roi, rois],
            lambda x, rr: R.roi_align(x, rr, (2, 2), 0.5, 2, False, "max"),
        ),
        "deform_roi_pool": (
            lambda x, rr, o: deform_roi_pool(x, rr, o, (2, 3), 0.5, 2, 0.1),
            [x_roi, rois, r(5, 2, 2, 3) * 0.5],
            lambda x, rr, o: R.deform_roi_pool(x, rr, o, (2, 3), 0.5, 2, 0.1),
        ),
        "deform_psroi_pool": (
            lambda x, rr, t: deform_psroi_pool(x, rr, t, 0.5, 3, 2, 2, 2, 2, 0.2),
            [x_roi, rois, r(5, 2, 2, 2) * 0.5],
            lambda x, rr, t: R.deform_psroi_pool(x, rr, t, 0.5, 3, 2, 2, 2, 2, 0.2)[0],
        ),
        # (maps, rois, maps): the RoIs stay input 1 as in the other RoI ops; both levels get RoIs.
        "multi_level_roi_align": (
            lambda f0, rr, f1: multi_level_roi_align([f0, f1], rr, (3, 2), [2.0, 4.0], 2, 2),
            [x_roi, rois, r(2, 8, 5, 4)],
            _multi_level_np,
        ),
    }


OPS = ["deform_conv2d", "roi_align", "roi_align_max", "deform_roi_pool", "deform_psroi_pool", "multi_level_roi_align"]


def _grads(fn, tensors, gy):
    """Output and the gradient of every floating tensor except the RoIs (index 1 of the RoI ops)."""
    leaves = [t.detach().clone().requires_grad_(True) for t in tensors]
    y = fn(*leaves)
    y.backward(gy)
    return y.detach(), [t.grad for t in leaves]


def _differentiable(name, i):
    return name == "deform_conv2d" or i != 1  # no gradient for rois


# ---- CPU float16 / bfloat16 ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("name", OPS)
def test_cpu_reduced_precision_matches_float64(name, dtype):
    fn, tensors, np_ref = _cases(torch.Generator().manual_seed(11))[name]
    rounded = [t.to(dtype) for t in tensors]  # the inputs as the user holds them
    exact = [t.double() for t in rounded]     # the same values in float64
    y64 = fn(*exact)
    gy = torch.randn(y64.shape, dtype=torch.float64).to(dtype)

    y, grads = _grads(fn, rounded, gy)
    assert_rounded(y, np_ref(*[t.numpy() for t in exact]), dtype, f"{name} forward")  # independent reference
    _, grads64 = _grads(fn, exact, gy.double())
    for i, (g, g64) in enumerate(zip(grads, grads64)):
        if _differentiable(name, i):
            assert g64.abs().max() > 0
            assert_rounded(g, g64, dtype, f"{name} gradient of input {i}")


def test_cpu_float16_offset_gradient_beats_float16_arithmetic():
    """What the bound rejects: the offset gradient computed in float16 arithmetic (torchvision's CPU
    kernel does this) is far outside it; ours, computed in float32, is inside."""
    tv = pytest.importorskip("torchvision.ops")
    fn, tensors, _ = _cases(torch.Generator().manual_seed(11))["deform_conv2d"]
    half = [t.half() for t in tensors]
    gy = torch.randn(2, 6, 4, 3, dtype=torch.float64).half()
    _, g64 = _grads(fn, [t.double() for t in half], gy.double())

    def tv_fn(x, offset, weight, bias, mask):
        return tv.deform_conv2d(x, offset, weight, bias, stride=2, padding=1, mask=mask)

    try:
        _, g_tv = _grads(tv_fn, half, gy)
    except RuntimeError as e:  # a torchvision without CPU float16
        pytest.skip(f"torchvision has no CPU float16 deform_conv2d here: {e}")
    with pytest.raises(AssertionError, match="exceeds"):
        assert_rounded(g_tv[1], g64[1], torch.float16, "torchvision offset gradient")
    _, ours = _grads(fn, half, gy)
    assert_rounded(ours[1], g64[1], torch.float16, "dcnkit offset gradient")


def test_cpu_reduced_precision_count_and_empty():
    x = torch.randn(1, 8, 6, 6).bfloat16()
    rois = torch.tensor([[0.0, 1, 1, 4, 4]]).bfloat16()
    out, count = torch.ops.dcnkit.deform_psroi_pool(x, rois, None, 1.0, 2, 2, 2, 0, 2, 0.0)
    ref_out, ref_count = R.deform_psroi_pool(_NP(x), _NP(rois), None, 1.0, 2, 2, 2, None, 2, 0.0)
    assert count.dtype == torch.bfloat16 and torch.equal(count.double(), torch.from_numpy(ref_count))
    assert_rounded(out, ref_out, torch.bfloat16, "deform_psroi_pool")
    empty = roi_align(x.half(), torch.zeros(0, 5).half(), 2)
    assert empty.dtype == torch.float16 and empty.shape == (0, 8, 2, 2)


# ---- torch.autocast on the CPU ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("name", OPS)
def test_cpu_autocast_float32_inputs_give_float32_results(name, dtype):
    fn, tensors, np_ref = _cases(torch.Generator().manual_seed(12))[name]
    t32 = [t.float() for t in tensors]
    gy = torch.randn(fn(*t32).shape)
    y32, g32 = _grads(fn, t32, gy)
    with torch.autocast("cpu", dtype=dtype):
        y, grads = _grads(fn, t32, gy)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, y32, rtol=0, atol=0)
    torch.testing.assert_close(y.double(), torch.from_numpy(np_ref(*[_NP(t) for t in t32])), rtol=1e-5, atol=1e-5)
    for i, (g, e) in enumerate(zip(grads, g32)):
        if _differentiable(name, i):
            assert g.dtype == torch.float32
            torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("name", OPS)
def test_cpu_autocast_reduced_input_computes_in_float32(name, dtype):
    """A reduced-precision feature map (as a conv under autocast returns) with float32 offsets, weights
    and RoIs: dtype errors without autocast; under it the float32 computation, returned in input's dtype."""
    fn, tensors, _ = _cases(torch.Generator().manual_seed(13))[name]
    mixed = [tensors[0].to(dtype)] + [t.float() for t in tensors[1:]]
    with pytest.raises(TypeError, match="expected dtype"):
        fn(*mixed)
    gy = torch.randn(fn(*[t.float() for t in mixed]).shape).to(dtype)
    y32, g32 = _grads(fn, [t.float() for t in mixed], gy.float())
    with torch.autocast("cpu", dtype=dtype):
        y, grads = _grads(fn, mixed, gy)
    torch.testing.assert_close(y, y32.to(dtype), rtol=0, atol=0)
    for i, (g, e, t) in enumerate(zip(grads, g32, mixed)):
        if _differentiable(name, i):
            assert g.dtype == t.dtype
            torch.testing.assert_close(g, e.to(t.dtype), rtol=0, atol=0)


def test_cpu_autocast_keeps_float64():
    fn, tensors, np_ref = _cases(torch.Generator().manual_seed(14))["deform_roi_pool"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fn(*tensors)
    assert y.dtype == torch.float64
    torch.testing.assert_close(y, torch.from_numpy(np_ref(*[t.numpy() for t in tensors])), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", REDUCED)
def test_cpu_autocast_training_step_with_modules(dtype):
    """An AMP step through every kind of module (a dtype error before autocast kernels): torch's layers run
    in dtype, ours in float32; loss and gradients are the float32 model's up to those layers' rounding."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.dcn = dnn.ModulatedDeformConv2dPack(8, 8, 3, padding=1, deform_groups=2)
            self.dcn1 = dnn.DeformConv2dPack(8, 8, 3, padding=1)
            self.align = dnn.RoIAlign(2, 0.5, 2)
            self.pool = dnn.ModulatedDeformRoIPoolPack(2, 8, 16, 0.5)
            self.ps = dnn.DeformPSRoIPool(0.5, 2, 2, group_size=2)
            self.fc = torch.nn.Linear(8 * 4 * 2 + 2 * 4, 1)

        def forward(self, img, rois):
            f = self.dcn1(torch.relu(self.dcn(self.stem(img))))
            feats = [self.align(f, rois), self.pool(f, rois), self.ps(f, rois)]
            return self.fc(torch.cat([t.flatten(1).float() for t in feats], 1)).square().mean()

    torch.manual_seed(0)
    net = Net()
    with torch.no_grad():
        for name, p in net.named_parameters():
            if "offset" in name or "mask_fc" in name:
                p.normal_(0, 0.05)
    img, rois = torch.randn(2, 3, 10, 10), rand_rois(4, 2, 20, 20, inside=True, dtype=torch.float32)
    net.zero_grad()
    expected_loss = net(img, rois)
    expected_loss.backward()
    expected = {k: p.grad.clone() for k, p in net.named_parameters()}
    net.zero_grad()
    with torch.autocast("cpu", dtype=dtype):
        loss = net(img, rois)
    loss.backward()
    torch.testing.assert_close(loss.float(), expected_loss.detach(), rtol=0.05, atol=0)
    for k, p in net.named_parameters():
        assert p.grad.dtype == torch.float32 and torch.isfinite(p.grad).all(), k
    # The layers whose gradients pass through our ops' backward (the hidden ReLU layers of the Packs'
    # small MLPs flip units in reduced precision and are left out).
    for k in ("stem.weight", "dcn.weight", "dcn.bias", "dcn1.weight", "fc.weight"):
        grad = dict(net.named_parameters())[k].grad
        assert (grad - expected[k]).norm() <= 0.05 * expected[k].norm(), k


# ---- autocast is excluded inside the kernels (the CUDA schedule's ATen GEMM, run on the CPU) --------

_SCHEDULE_CHILD = textwrap.dedent("""
    import sys
    import torch
    from dcnkit.ops import deform_conv2d
    a = torch.load(sys.argv[1])
    op = torch.ops.dcnkit.deform_conv2d.default
    below_autocast = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
    out = {}
    for bias in (a["bias"], None):
        key = "bias" if bias is not None else "nobias"
        args = (a["input"], a["offset"], a["weight"], bias, a["mask"], 1, 1, 1, 1, 1, 1, 1, 1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out[key + "/autocast"] = deform_conv2d(a["input"], a["offset"], a["weight"], bias, padding=1,
                                                   mask=a["mask"])
            # The kernel itself (no autocast kernel in front of it), with autocast on.
            out[key + "/kernel"] = op.redispatch(below_autocast, *args)
            # The backward op has no autocast kernel at all.
            out[key + "/backward"] = torch.ops.dcnkit._deform_conv2d_backward(a["gy"], *args)
            out[key + "/bf16"] = deform_conv2d(a["input"].bfloat16(), a["offset"], a["weight"], bias, padding=1,
                                               mask=a["mask"])
    torch.save(out, sys.argv[2])
""")


def test_autocast_excluded_inside_kernels_cuda_schedule(tmp_path):
    g = torch.Generator().manual_seed(21)
    # Channels and spatial size large enough that a bfloat16 GEMM is off by ~1e-2 (float32: ~1e-6).
    a = dict(input=torch.randn(2, 16, 9, 9, generator=g), offset=torch.randn(2, 18, 9, 9, generator=g),
             weight=torch.randn(32, 16, 3, 3, generator=g), bias=torch.randn(32, generator=g),
             mask=torch.rand(2, 9, 9, 9, generator=g), gy=torch.randn(2, 32, 9, 9, generator=g))
    torch.save(a, tmp_path / "in.pt")
    env = dict(os.environ, DCNKIT_DCN_CPU_PATH="cuda-schedule", DCNKIT_NO_DIRECT_BLAS="1")
    subprocess.run([sys.executable, "-c", _SCHEDULE_CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                   env=env, check=True, timeout=300)
    out = torch.load(tmp_path / "out.pt")
    for bias in (a["bias"], None):
        key = "bias" if bias is not None else "nobias"
        expected = torch.from_numpy(R.deform_conv2d(_NP(a["input"]), _NP(a["offset"]), _NP(a["weight"]), _NP(bias),
                                                    (1, 1), (1, 1), (1, 1), _NP(a["mask"])))
        for how in ("autocast", "kernel"):
            y = out[f"{key}/{how}"]
            assert y.dtype == torch.float32
            torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-4, msg=f"{key}/{how}")
        # A bfloat16 input: the float32 computation on its values, rounded to bfloat16.
        x16 = a["input"].bfloat16()
        exp16 = R.deform_conv2d(_NP(x16), _NP(a["offset"]), _NP(a["weight"]), _NP(bias), (1, 1), (1, 1), (1, 1),
                                _NP(a["mask"]))
        assert_rounded(out[f"{key}/bf16"], exp16, torch.bfloat16, f"{key}/bf16")
        # Gradients: the float64 computation's, to float32 accuracy.
        leaves = {k: a[k].double().requires_grad_() for k in ("input", "offset", "weight", "mask")}
        b64 = bias.double().requires_grad_() if bias is not None else None
        y64 = deform_conv2d(leaves["input"], leaves["offset"], leaves["weight"], b64, padding=1, mask=leaves["mask"])
        y64.backward(a["gy"].double())
        gi, go, gw, gb, gm = out[f"{key}/backward"]
        for name, got in (("input", gi), ("offset", go), ("weight", gw), ("mask", gm)):
            assert got.dtype == torch.float32
            torch.testing.assert_close(got.double(), leaves[name].grad, rtol=1e-4, atol=1e-3,
                                       msg=f"{key}/backward {name}")
        if bias is not None:
            torch.testing.assert_close(gb.double(), b64.grad, rtol=1e-5, atol=1e-4)


# ---- CUDA (skipped without a GPU) ------------------------------------------------------------------

requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (none on this machine)")


@requires_cuda
@pytest.mark.parametrize("dtype", REDUCED)
@pytest.mark.parametrize("name", OPS)
def test_cuda_autocast_forward_backward(name, dtype):
    fn, tensors, np_ref = _cases(torch.Generator().manual_seed(15))[name]
    t32 = [t.float().cuda() for t in tensors]
    gy = torch.randn(fn(*t32).shape, device="cuda")
    y32, g32 = _grads(fn, t32, gy)
    torch.testing.assert_close(y32.double().cpu(), torch.from_numpy(np_ref(*[_NP(t.cpu()) for t in t32])),
                               rtol=1e-5, atol=1e-5)
    with torch.autocast("cuda", dtype=dtype):
        y, grads = _grads(fn, t32, gy)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y, y32, rtol=1e-6, atol=1e-6)
    for i, (g, e) in enumerate(zip(grads, g32)):
        if _differentiable(name, i):
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    # A reduced-precision input under autocast: float32 computation, returned in its dtype.
    mixed = [t32[0].to(dtype)] + t32[1:]
    with torch.autocast("cuda", dtype=dtype):
        y, grads = _grads(fn, mixed, gy.to(dtype))
    ref32, _ = _grads(fn, [mixed[0].float()] + t32[1:], gy.to(dtype).float())
    assert y.dtype == dtype and grads[0].dtype == dtype
    torch.testing.assert_close(y, ref32.to(dtype), rtol=0, atol=0)

