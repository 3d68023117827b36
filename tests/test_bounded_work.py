"""Bounded work (docs/operators.md, bad input): no input makes a RoI operator run for more than seconds.

Adaptive grids visit only the samples that can land on the map (results bit-for-bit those of the full
loop: checked against the sample-by-sample references of sequential_roi_reference.py), and an explicit
sampling_ratio / sample_per_part above the documented limit (1024) is an error naming the argument in the
torch ops and modules and at ONNX Runtime session creation. The huge-RoI calls run in a subprocess with a
timeout: before the bound they never returned."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dcnkit  # noqa: F401
from dcnkit import reference as R
from dcnkit.nn import DeformPSRoIPool, DeformRoIPool, DeformRoIPoolPack, RoIAlign
from dcnkit.ops import deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align
from dcnkit.ops.roi_ops import MAX_SAMPLING_RATIO

import sequential_roi_reference as S

HERE = os.path.dirname(os.path.abspath(__file__))
BIG = 2**30


def run_bounded(code: str, tmp_path, timeout=60):
    """Runs `code` (which saves arrays to OUT) in a fresh interpreter; fails if it takes over `timeout` s."""
    out = tmp_path / "out.npz"
    script = "import numpy as np, torch, dcnkit\nOUT = %r\n" % str(out) + textwrap.dedent(code)
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the call did not return within {timeout} s (unbounded work)")
    assert p.returncode == 0, p.stderr[-3000:]
    return dict(np.load(out))


# ------------------------------------------------------------------------------------------------
# The examples: huge RoIs with adaptive sampling return, with the full loop's result
# ------------------------------------------------------------------------------------------------
HUGE_CODE = """
from dcnkit.ops import roi_align, deform_roi_pool
res = {}
g = torch.Generator().manual_seed(0)
for name, dt in (("f32", torch.float32), ("f64", torch.float64)):
    x = torch.randn(1, 2, 8, 8, generator=g, dtype=dt).requires_grad_()
    rois = torch.tensor([[0, 0, 0, 1e9, 1e9], [0, -1e9, -3e8, 1e9, 7.5], [0, 3.3, -1e7, 5.1, 1e7]], dtype=dt)
    off = (torch.rand(3, 2, 2, 2, generator=g, dtype=dt) - 0.5) * 1e-8
    go = torch.randn(3, 2, 2, 2, generator=g, dtype=dt)
    for mode in ("avg", "max"):
        y = roi_align(x, rois, (2, 2), 1.0, -1, False, mode)
        res[f"ra_{mode}_{name}"] = y.detach().numpy()
        if mode == "avg":
            (gx,) = torch.autograd.grad(y, x, go)
            res[f"ra_grad_{name}"] = gx.numpy()
    y = deform_roi_pool(x, rois, off, (2, 2), 1.0, 0, 0.1)
    res[f"dr_{name}"] = y.detach().numpy()
    (gx,) = torch.autograd.grad(y, x, go)
    res[f"dr_grad_{name}"] = gx.numpy()
    res[f"x_{name}"], res[f"rois_{name}"] = x.detach().numpy(), rois.numpy()
    res[f"off_{name}"], res[f"go_{name}"] = off.numpy(), go.numpy()
np.savez(OUT, **res)
"""


def test_huge_rois_adaptive_return_and_equal_the_full_loop(tmp_path):
    res = run_bounded(HUGE_CODE, tmp_path)
    for name in ("f32", "f64"):
        # float32 puts up to ~64 consecutive samples of a 1e9-pixel box on one point: a wider window
        W8 = 200 if name == "f32" else 8
        x, rois, off, go = (res[f"{k}_{name}"] for k in ("x", "rois", "off", "go"))
        for mode in ("avg", "max"):
            expected = S.roi_align(x, rois, (2, 2), 1.0, -1, False, mode, window=W8)
            np.testing.assert_array_equal(res[f"ra_{mode}_{name}"], expected, err_msg=f"roi_align {mode} {name}")
        np.testing.assert_array_equal(res[f"dr_{name}"], S.deform_roi_pool(x, rois, off, (2, 2), 1.0, 0, 0.1, window=W8))
        tol = dict(rtol=1e-5, atol=1e-12) if name == "f32" else dict(rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(res[f"ra_grad_{name}"],
                                   S.avg_input_grad(x, rois, None, (2, 2), 1.0, -1, False, 0.0, go, window=W8), **tol)
        np.testing.assert_allclose(res[f"dr_grad_{name}"],
                                   S.avg_input_grad(x, rois, off, (2, 2), 1.0, 0, True, 0.1, go, window=W8), **tol)
    # The first RoI's bin (0, 0) holds 8 x 8 of its 5e8 x 5e8 samples: a value of order 1e-16, not 0.
    assert 0 < np.abs(res["ra_avg_f64"][0, :, 0, 0]).max() < 1e-14


def test_huge_rois_in_onnxruntime_return(tmp_path):
    from test_ort_library import make_model  # noqa: F401  (model builder of the library tests)

    code = """
    from test_ort_library import make_model, cpu_session
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
    rois = np.array([[0, 0, 0, 1e9, 1e9], [0, -1e9, -3e8, 1e9, 7.5]], np.float32)
    ra = make_model("RoIAlign", [("x", [1, 2, 8, 8]), ("rois", ["K", 5])], output_size=[2, 2],
                    spatial_scale=1.0, sampling_ratio=0, aligned=0, pool_mode="avg")
    dr = make_model("DeformRoIPool", [("x", [1, 2, 8, 8]), ("rois", ["K", 5])], output_size=[2, 2],
                    spatial_scale=1.0, sampling_ratio=0)
    (a,) = cpu_session(ra).run(None, {"x": x, "rois": rois})
    (d,) = cpu_session(dr).run(None, {"x": x, "rois": rois})
    np.savez(OUT, x=x, rois=rois, a=a, d=d)
    """
    res = run_bounded(code, tmp_path)
    np.testing.assert_array_equal(res["a"], S.roi_align(res["x"], res["rois"], (2, 2), 1.0, 0, False, window=200))
    np.testing.assert_array_equal(res["d"], S.deform_roi_pool(res["x"], res["rois"], None, (2, 2), 1.0, 0, 0.1,
                                                              window=200))


def test_huge_rois_multi_level_return_and_equal_roi_align_on_their_level(tmp_path):
    # Boxes of 1e9 pixels go to the coarsest level; adaptive sampling there is as bounded as roi_align's.
    code = """
    from dcnkit.ops import multi_level_roi_align, roi_align
    g = torch.Generator().manual_seed(0)
    feats = [torch.randn(1, 2, 16, 16, generator=g, dtype=torch.float64),
             torch.randn(1, 2, 8, 8, generator=g, dtype=torch.float64)]
    rois = torch.tensor([[0, 0, 0, 1e9, 1e9], [0, -1e9, -3e8, 1e9, 7.5]], dtype=torch.float64)
    y = multi_level_roi_align(feats, rois, (2, 2), [4.0, 8.0], sampling_ratio=0, finest_scale=56, aligned=False)
    ref = roi_align(feats[1], rois, (2, 2), 1 / 8.0, 0, False)
    np.savez(OUT, y=y.numpy(), ref=ref.numpy())
    """
    res = run_bounded(code, tmp_path)
    np.testing.assert_array_equal(res["y"], res["ref"])


def test_float32_coordinates_that_round_together_stay_bounded(tmp_path):
    # In float32 around 2^30, ~128 consecutive samples round to one coordinate: still visited one by one
    # (exact); around 3e12, runs of ~2^18 equal samples exceed the per-axis cap and are weighted by their
    # length instead (bounded work; the sum differs from the sequential one in the last bits).
    code = """
    from dcnkit.ops import roi_align
    x = torch.randn(1, 3, 6, 5, generator=torch.Generator().manual_seed(3))
    rois = torch.tensor([[0, -2.0**30, -2.0**29, 2.0**30, 2.0**29], [0, -3e12, 1.0, 3e12, 4.0]])
    np.savez(OUT, x=x.numpy(), rois=rois.numpy(), avg=roi_align(x, rois, 1, 1.0, 0, True).numpy(),
             max=roi_align(x, rois, 1, 1.0, 0, True, "max").numpy())
    """
    res = run_bounded(code, tmp_path)
    x, rois = res["x"], res["rois"]
    # First RoI only for the sample-by-sample reference: about 64 x 128 samples land on pixel (0, 0).
    assert (res["avg"][0] != 0).all()
    np.testing.assert_array_equal(res["avg"][:1], S.roi_align(x, rois[:1], (1, 1), 1.0, 0, True, window=200))
    np.testing.assert_array_equal(res["max"][:1], S.roi_align(x, rois[:1], (1, 1), 1.0, 0, True, "max", window=200))
    assert np.isfinite(res["avg"]).all() and np.isfinite(res["max"]).all()


# ------------------------------------------------------------------------------------------------
# Property: the bounded loops equal the full loop, forward (bit for bit) and backward
# ------------------------------------------------------------------------------------------------
def _rois(rng, k, h, w, kind):
    """RoIs in feature pixels of an h x w map: inside, partly outside, fully outside, tiny or huge."""
    c = rng.uniform(-0.5, 1.5, (k, 2)) * [w, h]
    size = {"inside": rng.uniform(0.5, 0.5 * min(h, w), (k, 2)), "tiny": rng.uniform(0, 0.3, (k, 2)),
            "huge": rng.uniform(4, 12, (k, 2)) * [w, h], "outside": rng.uniform(1, 3, (k, 2))}[kind]
    if kind == "outside":
        c = np.where(rng.random((k, 2)) < 0.5, -size - 1.5, np.array([w, h]) + size + 1.5)
    rois = np.concatenate([np.zeros((k, 1)), c - size / 2, c + size / 2], 1)
    return rois[:, [0, 1, 2, 3, 4]]


@given(kind=st.sampled_from(["inside", "tiny", "huge", "outside"]), sr=st.sampled_from([0, -1, 1, 3]),
       aligned=st.booleans(), mode=st.sampled_from(["avg", "max"]), f32=st.booleans(),
       oh=st.integers(1, 3), ow=st.integers(1, 3), seed=st.integers(0, 2**16))
def test_roi_align_equals_the_full_loop(kind, sr, aligned, mode, f32, oh, ow, seed):
    rng = np.random.default_rng(seed)
    dt = np.float32 if f32 else np.float64
    x = rng.standard_normal((1, 2, 5, 6)).astype(dt)
    rois = _rois(rng, 3, 5, 6, kind).astype(dt)
    y = roi_align(torch.from_numpy(x), torch.from_numpy(rois), (oh, ow), 1.0, sr, aligned, mode)
    np.testing.assert_array_equal(y.numpy(), S.roi_align(x, rois, (oh, ow), 1.0, sr, aligned, mode))


@given(kind=st.sampled_from(["inside", "tiny", "huge", "outside"]), sr=st.sampled_from([0, 2]),
       f32=st.booleans(), scale=st.sampled_from([0.5, 1.0]), seed=st.integers(0, 2**16))
def test_deform_roi_pool_equals_the_full_loop(kind, sr, f32, scale, seed):
    rng = np.random.default_rng(seed)
    dt = np.float32 if f32 else np.float64
    x = rng.standard_normal((1, 2, 6, 5)).astype(dt)
    rois = (_rois(rng, 3, 6, 5, kind) / scale).astype(dt)
    offset = rng.uniform(-2, 2, (3, 2, 2, 2)).astype(dt)
    y = deform_roi_pool(torch.from_numpy(x), torch.from_numpy(rois), torch.from_numpy(offset), 2, scale, sr, 0.3)
    np.testing.assert_array_equal(y.numpy(), S.deform_roi_pool(x, rois, offset, (2, 2), scale, sr, 0.3))


@given(kind=st.sampled_from(["inside", "huge", "outside"]), spp=st.sampled_from([1, 4, 13]),
       seed=st.integers(0, 2**16))
def test_deform_psroi_pool_equals_the_reference(kind, spp, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((1, 8, 7, 6))
    rois = _rois(rng, 2, 7, 6, kind) * 2
    trans = rng.uniform(-1, 1, (2, 2, 2, 2))
    y, count = torch.ops.dcnkit.deform_psroi_pool(torch.from_numpy(x), torch.from_numpy(rois), torch.from_numpy(trans),
                                                  0.5, 2, 2, 2, 2, spp, 0.3)
    ey, ecount = R.deform_psroi_pool(x, rois, trans, 0.5, 2, 2, 2, 2, spp, 0.3)
    np.testing.assert_array_equal(count.numpy(), ecount)
    np.testing.assert_allclose(y.numpy(), ey, rtol=1e-13, atol=1e-15)


@pytest.mark.parametrize("kind", ["huge", "partly"])
def test_gradients_of_huge_and_partly_outside_rois(kind):
    x = torch.randn(1, 2, 5, 6, dtype=torch.float64, requires_grad=True)
    if kind == "huge":  # 30 x 40 samples per bin, a few hundred on the map
        rois = torch.tensor([[0, -40.3, -30.1, 40.6, 30.2]], dtype=torch.float64)
    else:
        rois = torch.tensor([[0, -3.3, 2.1, 2.7, 9.4]], dtype=torch.float64)
    off = (torch.rand(1, 2, 2, 2, dtype=torch.float64) * 0.1 - 0.05).requires_grad_()
    for mode in ("avg", "max"):
        assert torch.autograd.gradcheck(lambda a: roi_align(a, rois, 2, 1.0, 0, True, mode), (x,))
    assert torch.autograd.gradcheck(lambda a: deform_roi_pool(a, rois, off.detach(), 2, 1.0, 0, 0.1), (x,))
    # The offset gradient is the contract's (the bilinear form of the cell that holds each sample, which is
    # not the numerical derivative where samples are clamped at the map's border): against the reference.
    go = torch.randn(1, 2, 2, 2, dtype=torch.float64)
    (goff,) = torch.autograd.grad(deform_roi_pool(x, rois, off, 2, 1.0, 0, 0.1), off, go)
    ref = S.deform_roi_pool_offset_grad(x.detach().numpy(), rois.numpy(), off.detach().numpy(), (2, 2), 1.0, 0, 0.1,
                                        go.numpy())
    np.testing.assert_allclose(goff.numpy(), ref, rtol=1e-11, atol=1e-14)
    trans = (torch.rand(1, 2, 2, 2, dtype=torch.float64) - 0.5).requires_grad_()
    xp = torch.randn(1, 4, 5, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda a, t: deform_psroi_pool(a, rois, t, 1.0, 2, 1, 2, 2, 5, 0.1), (xp, trans))
    # and the input gradient is the full loop's
    go = torch.randn(1, 2, 2, 2, dtype=torch.float64)
    (gx,) = torch.autograd.grad(roi_align(x, rois, 2, 1.0, 0, True), x, go)
    ref = S.avg_input_grad(x.detach().numpy(), rois.numpy(), None, (2, 2), 1.0, 0, True, 0.0, go.numpy())
    np.testing.assert_allclose(gx.numpy(), ref, rtol=1e-12, atol=1e-15)


def test_bins_with_more_inside_samples_than_the_cpu_buffer():
    # 40 x 40 = 1600 samples inside one bin (> the 256 collected per chunk): sampled on the fly, same result.
    x = np.random.default_rng(1).standard_normal((1, 2, 20, 20))
    rois = np.array([[0, -1.0, -1.0, 39.0, 39.0]])
    y = roi_align(torch.from_numpy(x), torch.from_numpy(rois), 1, 0.5, 0, True, "max")
    np.testing.assert_array_equal(y.numpy(), S.roi_align(x, rois, (1, 1), 0.5, 0, True, "max"))
    y = roi_align(torch.from_numpy(x), torch.from_numpy(rois), 1, 0.5, 0, True)
    np.testing.assert_array_equal(y.numpy(), S.roi_align(x, rois, (1, 1), 0.5, 0, True))


def test_max_counts_outside_samples_as_zero():
    # All samples on the map are negative; samples off the map are 0 candidates, so the max is 0 and no
    # gradient flows; without any sample off the map the max is negative.
    x = -torch.rand(1, 1, 4, 4, dtype=torch.float64) - 1
    x.requires_grad_()
    out_and_in = torch.tensor([[0, -500.0, 0.5, 2.5, 2.5]], dtype=torch.float64)
    y = roi_align(x, out_and_in, 1, 1.0, 0, False, "max")
    assert y.item() == 0.0
    (g,) = torch.autograd.grad(y.sum(), x)
    assert (g == 0).all()
    inside = torch.tensor([[0, 0.5, 0.5, 2.5, 2.5]], dtype=torch.float64)
    assert roi_align(x, inside, 1, 1.0, 0, False, "max").item() < -1


# ------------------------------------------------------------------------------------------------
# Explicit grids above the limit: errors naming the argument (torch ops and modules)
# ------------------------------------------------------------------------------------------------
def _pool_inputs():
    x = torch.randn(1, 4, 8, 8)
    rois = torch.tensor([[0, 1.0, 1.0, 6.0, 6.0]])
    return x, rois


# 2**30 in process would hang without the limit: the subprocess test below runs that one.
@pytest.mark.parametrize("value", [MAX_SAMPLING_RATIO + 1])
def test_explicit_sampling_above_the_limit_is_an_error(value):
    x, rois = _pool_inputs()
    calls = {
        "sampling_ratio": [lambda: roi_align(x, rois, (2, 2), 1.0, value),
                           lambda: roi_align(x, rois, (2, 2), 1.0, value, True, "max"),
                           lambda: deform_roi_pool(x, rois, None, (2, 2), sampling_ratio=value),
                           lambda: multi_level_roi_align([x, x[:, :, ::2, ::2]], rois, (2, 2), [1.0, 2.0],
                                                         sampling_ratio=value)],
        "sample_per_part": [lambda: deform_psroi_pool(x, rois, None, 1.0, 2, 1, 2, sample_per_part=value)],
    }
    for arg, fns in calls.items():
        for fn in fns:
            with pytest.raises(ValueError) as info:
                fn()
            msg = str(info.value)
            assert arg in msg and "1024" in msg and str(value) in msg, msg


def test_limit_itself_is_accepted():
    x = torch.randn(1, 1, 3, 3, dtype=torch.float64)
    rois = torch.tensor([[0, 0.2, 0.4, 2.1, 1.9]], dtype=torch.float64)
    y = roi_align(x, rois, 1, 1.0, MAX_SAMPLING_RATIO, True)  # 2^20 samples in one bin
    # The mean over a fine grid of a bilinear map is the integral of the interpolant: close to a 64 x 64 grid.
    torch.testing.assert_close(y, roi_align(x, rois, 1, 1.0, 64, True), rtol=1e-3, atol=1e-3)
    assert deform_psroi_pool(x, rois, None, 1.0, 1, 1, 1, sample_per_part=MAX_SAMPLING_RATIO).isfinite().all()


@pytest.mark.parametrize("make", [
    lambda v: RoIAlign(2, sampling_ratio=v),
    lambda v: RoIAlign(2, sampling_ratio=v, use_torchvision=True),
    lambda v: DeformRoIPool(2, sampling_ratio=v),
    lambda v: DeformRoIPoolPack(2, 4, 8, sampling_ratio=v),
    lambda v: DeformPSRoIPool(1.0, 2, 1, 2, sample_per_part=v),
])
def test_modules_check_the_limit_at_construction(make):
    with pytest.raises(ValueError) as info:
        make(BIG)
    msg = str(info.value)
    assert ("sampling_ratio" in msg or "sample_per_part" in msg) and "1024" in msg and str(BIG) in msg, msg
    make(MAX_SAMPLING_RATIO)  # the limit itself is fine


def test_explicit_limit_calls_return_quickly_in_a_subprocess(tmp_path):
    # The calls, each of which used to hang: now a ValueError at once.
    code = """
    from dcnkit.ops import roi_align, deform_roi_pool, deform_psroi_pool
    x = torch.randn(1, 4, 8, 8); rois = torch.tensor([[0, 1.0, 1.0, 6.0, 6.0]])
    msgs = []
    for fn in (lambda: roi_align(x, rois, (2, 2), 1.0, 2**30),
               lambda: deform_roi_pool(x, rois, None, (2, 2), sampling_ratio=2**30),
               lambda: deform_psroi_pool(x, rois, None, 1.0, 2, 1, 2, sample_per_part=2**30)):
        try:
            fn()
            msgs.append("returned")
        except ValueError as e:
            msgs.append(str(e))
    np.savez(OUT, msgs=np.array(msgs))
    """
    msgs = list(run_bounded(code, tmp_path)["msgs"])
    assert "sampling_ratio" in msgs[0] and "sampling_ratio" in msgs[1] and "sample_per_part" in msgs[2], msgs


# ------------------------------------------------------------------------------------------------
# ONNX Runtime: an explicit grid above the limit fails at session creation, naming the attribute
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("domain,op_type,inputs,attrs,arg", [
    ("dcnkit", "DeformRoIPool", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])], {"sampling_ratio": BIG},
     "sampling_ratio"),
    ("dcnkit", "RoIAlign", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])], {"sampling_ratio": BIG}, "sampling_ratio"),
    ("dcnkit", "DeformPSRoIPool", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])],
     {"sample_per_part": BIG, "no_trans": 1, "output_dim": 2}, "sample_per_part"),
    ("mmcv", "MMCVRoiAlign", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])],
     {"output_height": 2, "output_width": 2, "sampling_ratio": BIG}, "sampling_ratio"),
    ("mmcv", "MMCVDeformRoIPool", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])],
     {"pooled_height": 2, "pooled_width": 2, "sampling_ratio": float(BIG)}, "sampling_ratio"),
    ("dcnkit", "MultiLevelRoIAlign", [("r", ["K", 5]), ("f0", ["N", 2, "H", "W"]), ("f1", ["N", 2, "H1", "W1"])],
     {"output_size": [2, 2], "featmap_strides": [4.0, 8.0], "sampling_ratio": BIG}, "sampling_ratio"),
    ("mmdeploy", "MMCVMultiLevelRoiAlign", [("r", ["K", 5]), ("f0", ["N", 2, "H", "W"])],
     {"output_height": 2, "output_width": 2, "featmap_strides": [4.0], "sampling_ratio": BIG}, "sampling_ratio"),
])
def test_ort_session_creation_rejects_grids_above_the_limit(domain, op_type, inputs, attrs, arg):
    from test_ort_library import cpu_session, make_model

    model = make_model(op_type, inputs, domain=domain, name="greedy", **attrs)
    with pytest.raises(Exception) as info:
        cpu_session(model)
    msg = str(info.value)
    for frag in ("greedy", arg, "1024", str(BIG)):
        assert frag in msg, msg
