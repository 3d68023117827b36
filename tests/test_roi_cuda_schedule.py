"""RoIAlign's CUDA block schedule checked on the CPU: DCNKIT_ROI_CPU_PATH=cuda-schedule runs the launchers'
decomposition (plugins/core/include/dcnkit/roi_plan.h: one block per (RoI, group of 32 channels), the RoI's
sampling plan computed once per block, then 256 threads over (channel, bin) pairs; the bounded visit for grids
too large to plan) serially, and its forward and backward must give the CPU driver's results: the plan path
(explicit grids, small adaptive grids), the visit path (ratio 5, a huge adaptive box), both in one call, avg
and max, two channel groups (40 channels), boxes partly and wholly outside the map."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

import dcnkit  # noqa: F401
from dcnkit.ops import roi_align

# (pooled, sampling_ratio, aligned, mode)
CASES = [((7, 7), 2, True, "avg"), ((7, 7), 2, False, "max"), ((3, 2), 4, True, "avg"), ((2, 3), 1, False, "max"),
         ((3, 3), 0, True, "avg"), ((3, 3), 0, False, "max"), ((2, 2), 5, True, "avg"), ((2, 2), 5, True, "max"),
         ((32, 33), 1, True, "avg"), ((4, 4), 0, True, "max")]

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
    out.append({"y": y.detach(), "gx": x.grad})
torch.save(out, sys.argv[2])
"""


def _inputs():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 40, 11, 13, generator=g, dtype=torch.float64)
    rois = torch.tensor([[0, 2.0, 3.0, 14.0, 17.0],     # inside
                         [1, -6.0, -4.0, 9.0, 30.0],    # partly outside
                         [1, 40.0, 40.0, 60.0, 70.0],   # wholly outside
                         [0, 5.0, 5.0, 5.5, 5.2],       # tiny
                         [1, -1e6, -2e6, 3e6, 4e6],     # huge: adaptive grids go through the bounded visit
                         [0, 1.0, 20.0, 25.0, 2.0]],    # inverted
                        dtype=torch.float64)
    cases = []
    for pooled, ratio, aligned, mode in CASES:
        y = roi_align(x, rois, pooled, 0.5, ratio, aligned, mode)
        cases.append({"x": x, "rois": rois, "pooled": pooled, "ratio": ratio, "aligned": aligned, "mode": mode,
                      "gy": torch.randn(y.shape, generator=g, dtype=torch.float64)})
    return cases


def test_cuda_schedule_matches_the_cpu_driver(tmp_path):
    cases = _inputs()
    torch.save(cases, tmp_path / "in.pt")
    env = dict(os.environ, DCNKIT_ROI_CPU_PATH="cuda-schedule")
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], env=env,
                   check=True, timeout=300)
    got = torch.load(tmp_path / "out.pt")
    for a, o in zip(cases, got):
        x = a["x"].clone().requires_grad_()
        y = roi_align(x, a["rois"], a["pooled"], 0.5, a["ratio"], a["aligned"], a["mode"])
        y.backward(a["gy"])
        what = f"{a['pooled']} ratio {a['ratio']} aligned {a['aligned']} {a['mode']}"
        assert y.abs().sum() > 0, what
        # the same samples in the same order: the forward is bit-identical; the backward adds in another order
        torch.testing.assert_close(o["y"], y.detach(), rtol=0, atol=0, msg=lambda m: f"{what}: {m}")
        torch.testing.assert_close(o["gx"], x.grad, rtol=1e-12, atol=1e-12, msg=lambda m: f"{what} grad: {m}")
