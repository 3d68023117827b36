"""RoIAlign's deterministic CUDA backward (torch.use_deterministic_algorithms; plugins/core/include/dcnkit/
roi_align_sorted.h), checked on the CPU: DCNKIT_ROI_CPU_PATH=cuda-schedule-deterministic runs its grids serially
(the plan of fixed slots keyed by (image, pixel), the stable sort, the arg-max of max mode, the pixel gather). Its
grad_input must equal the atomic schedule's (DCNKIT_ROI_CPU_PATH=cuda-schedule), the CPU driver's and, in avg mode,
the sample-by-sample reference (tests/sequential_roi_reference.py), in float64, for avg and max, aligned or not,
sampling_ratio 0 (adaptive) and 2, several RoIs incl. overlapping ones and two images, max-mode ties. The adaptive
grids here stay within a plan (at most 16 samples per bin); one too large for a plan (a large box) has no deterministic
path: the CPU schedule raises (CUDA: a device-side assert). On a GPU, the backward is bit-identical over two runs
(tests/test_cuda_deterministic.py covers the op cases too)."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import dcnkit  # noqa: F401
from dcnkit.ops import roi_align
from sequential_roi_reference import avg_input_grad

# (pooled, sampling_ratio, aligned, mode)
CASES = [((3, 3), 2, True, "avg"), ((3, 3), 2, False, "max"), ((2, 3), 0, True, "max"), ((3, 2), 0, False, "avg"),
         ((4, 4), 0, True, "avg"), ((2, 2), 2, True, "max")]

_CHILD = """
import sys, torch
import dcnkit
from dcnkit.ops import roi_align
inp = torch.load(sys.argv[1])
out = []
for a in inp:
    x = a["x"].clone().requires_grad_()
    y = roi_align(x, a["rois"], a["pooled"], 0.5, a["ratio"], a["aligned"], a["mode"])
    y.backward(a["gy"])
    out.append(x.grad)
torch.save(out, sys.argv[2])
"""


def _cases():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, 5, 9, 10, generator=g, dtype=torch.float64)
    rois = torch.tensor([[0, 2.0, 3.0, 14.0, 15.0],    # inside
                         [0, 4.0, 5.0, 16.0, 13.0],    # overlaps the first
                         [1, -6.0, -4.0, 9.0, 14.0],   # partly outside
                         [1, 3.0, 3.0, 3.5, 3.2],      # tiny
                         [1, 30.0, 30.0, 40.0, 44.0],  # wholly outside
                         [0, 1.0, 17.0, 19.0, 2.0]],   # inverted
                        dtype=torch.float64)
    cases = []
    for pooled, ratio, aligned, mode in CASES:
        y = roi_align(x, rois, pooled, 0.5, ratio, aligned, mode)
        cases.append({"x": x, "rois": rois, "pooled": pooled, "ratio": ratio, "aligned": aligned, "mode": mode,
                      "gy": torch.randn(y.shape, generator=g, dtype=torch.float64)})
    # max mode with ties: a map of 0s and 1s, whose samples tie often (the first largest wins, as in the forward)
    xt = torch.randint(0, 2, (2, 5, 9, 10), generator=g).to(torch.float64)
    for ratio in (0, 2):
        y = roi_align(xt, rois, (3, 3), 0.5, ratio, True, "max")
        cases.append({"x": xt, "rois": rois, "pooled": (3, 3), "ratio": ratio, "aligned": True, "mode": "max",
                      "gy": torch.randn(y.shape, generator=g, dtype=torch.float64)})
    return cases


def _run_child(tmp_path, path, cases, tag):
    src, dst = tmp_path / f"in_{tag}.pt", tmp_path / f"out_{tag}.pt"
    torch.save(cases, src)
    env = dict(os.environ, DCNKIT_ROI_CPU_PATH=path)
    return subprocess.run([sys.executable, "-c", _CHILD, str(src), str(dst)], env=env, capture_output=True, text=True,
                          timeout=300)


def test_deterministic_schedule_matches_the_atomic_schedule_and_the_reference(tmp_path):
    cases = _cases()
    runs = {}
    for path in ("cuda-schedule-deterministic", "cuda-schedule"):
        r = _run_child(tmp_path, path, cases, path)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[path] = torch.load(tmp_path / f"out_{path}.pt")
    for i, a in enumerate(cases):
        what = f"{a['pooled']} ratio {a['ratio']} aligned {a['aligned']} {a['mode']}"
        got, atomic = runs["cuda-schedule-deterministic"][i], runs["cuda-schedule"][i]
        x = a["x"].clone().requires_grad_()
        roi_align(x, a["rois"], a["pooled"], 0.5, a["ratio"], a["aligned"], a["mode"]).backward(a["gy"])
        assert got.abs().sum() > 0, what
        torch.testing.assert_close(got, atomic, rtol=0, atol=1e-12, msg=lambda m: f"{what} vs atomic: {m}")
        torch.testing.assert_close(got, x.grad, rtol=0, atol=1e-12, msg=lambda m: f"{what} vs CPU driver: {m}")
        if a["mode"] == "avg":
            ref = avg_input_grad(a["x"].numpy(), a["rois"].numpy(), None, a["pooled"], 0.5, a["ratio"], a["aligned"],
                                 0.0, a["gy"].numpy())
            np.testing.assert_allclose(got.numpy(), ref, rtol=0, atol=1e-12, err_msg=f"{what} vs reference")


def test_huge_adaptive_grid_has_no_deterministic_path(tmp_path):
    x = torch.randn(1, 2, 6, 7, dtype=torch.float64)
    rois = torch.tensor([[0, -1e5, -1e5, 1e5, 1e5]], dtype=torch.float64)  # ~1e5 samples per bin: the bounded visit
    case = {"x": x, "rois": rois, "pooled": (2, 2), "ratio": 0, "aligned": True, "mode": "avg",
            "gy": torch.ones(1, 2, 2, 2, dtype=torch.float64)}
    r = _run_child(tmp_path, "cuda-schedule-deterministic", [case], "huge")
    assert r.returncode != 0
    assert "no deterministic path" in r.stderr, r.stderr[-2000:]
    r = _run_child(tmp_path, "cuda-schedule", [case], "huge-atomic")  # the atomic schedule runs it
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.cuda
@pytest.mark.parametrize("mode,ratio", [("avg", 2), ("max", 0)])
def test_cuda_deterministic_backward_is_bit_identical(mode, ratio):
    a = next(c for c in _cases() if c["mode"] == mode and c["ratio"] == ratio)
    before = torch.are_deterministic_algorithms_enabled()
    grads = []
    try:
        for deterministic in (True, True, False):
            torch.use_deterministic_algorithms(deterministic)
            x = a["x"].cuda().float().requires_grad_()
            roi_align(x, a["rois"].cuda().float(), a["pooled"], 0.5, ratio, a["aligned"], mode).backward(
                a["gy"].cuda().float())
            grads.append(x.grad)
    finally:
        torch.use_deterministic_algorithms(before)
    assert torch.equal(grads[0], grads[1])  # bit for bit
    torch.testing.assert_close(grads[0], grads[2])  # the atomic path
