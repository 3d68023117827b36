"""RoIAlign's and MultiLevelRoIAlign's CUDA block schedule, checked on the CPU: DCNKIT_ROI_CPU_PATH=cuda-schedule runs the launchers'
decomposition (plugins/core/include/dcnkit/roi_plan.h: one block per (RoI, group of 32 channels), the RoI's
sampling plan computed once per block, then 256 threads over (channel, bin) pairs; the bounded visit for grids
too large to plan) serially, and its forward and backward must give the CPU driver's results: the plan path
(explicit grids, small adaptive grids), the visit path (ratio 5, a huge adaptive box), both in one call, avg
and max, two channel groups (40 channels), boxes partly and wholly outside the map; MultiLevelRoIAlign with RoIs
on three levels (each block plans on its RoI's level); DeformRoIPool with and without offsets (each block plans
every bin with its offsets applied), output and grad_input (grad_offset stays on the CPU driver); DeformPSRoIPool's
forward and grad_input (psroi_plan.h: without trans, with one class, and the grid-stride fallbacks of two classes and
25 samples per bin)."""
from __future__ import annotations

import os
import subprocess
import sys

import torch

import dcnkit  # noqa: F401
from dcnkit.ops import deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align

# (pooled, sampling_ratio, aligned, mode)
CASES = [((7, 7), 2, True, "avg"), ((7, 7), 2, False, "max"), ((3, 2), 4, True, "avg"), ((2, 3), 1, False, "max"),
         ((3, 3), 0, True, "avg"), ((3, 3), 0, False, "max"), ((2, 2), 5, True, "avg"), ((2, 2), 5, True, "max"),
         ((32, 33), 1, True, "avg"), ((4, 4), 0, True, "max")]

_CHILD = """
import sys, torch
import dcnkit
from dcnkit.ops import deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align
inp = torch.load(sys.argv[1])
out = []
for a in inp:
    if "trans" in a:
        x = a["x"].clone().requires_grad_()
        y = deform_psroi_pool(x, a["rois"], a["trans"], 0.5, 3, 40, 2, 3, a["ratio"], 0.2)
        y.backward(a["gy"])
        out.append({"y": y.detach(), "gx": x.grad})
        continue
    if "offset" in a:
        x = a["x"].clone().requires_grad_()
        y = deform_roi_pool(x, a["rois"], a["offset"], a["pooled"], 0.5, a["ratio"], 0.1)
        y.backward(a["gy"])
        out.append({"y": y.detach(), "gx": x.grad})
        continue
    if "levels" in a:
        fs = [f.clone().requires_grad_() for f in a["levels"]]
        y = multi_level_roi_align(fs, a["rois"], a["pooled"], [2.0, 4.0, 8.0], a["ratio"], 8, 1.0, a["aligned"],
                                  a["mode"])
        y.backward(a["gy"])
        out.append({"y": y.detach(), "gx": [f.grad for f in fs]})
        continue
    x = a["x"].clone().requires_grad_()
    y = roi_align(x, a["rois"], a["pooled"], 0.5, a["ratio"], a["aligned"], a["mode"])
    y.backward(a["gy"])
    out.append({"y": y.detach(), "gx": x.grad})
torch.save(out, sys.argv[2])
"""


def _run_here(a):
    if "trans" in a:
        x = a["x"].clone().requires_grad_()
        y = deform_psroi_pool(x, a["rois"], a["trans"], 0.5, 3, 40, 2, 3, a["ratio"], 0.2)
        y.backward(a["gy"])
        return y.detach(), x.grad
    if "offset" in a:
        x = a["x"].clone().requires_grad_()
        y = deform_roi_pool(x, a["rois"], a["offset"], a["pooled"], 0.5, a["ratio"], 0.1)
        y.backward(a["gy"])
        return y.detach(), x.grad
    if "levels" in a:
        fs = [f.clone().requires_grad_() for f in a["levels"]]
        y = multi_level_roi_align(fs, a["rois"], a["pooled"], [2.0, 4.0, 8.0], a["ratio"], 8, 1.0, a["aligned"],
                                  a["mode"])
        y.backward(a["gy"])
        return y.detach(), [f.grad for f in fs]
    x = a["x"].clone().requires_grad_()
    y = roi_align(x, a["rois"], a["pooled"], 0.5, a["ratio"], a["aligned"], a["mode"])
    y.backward(a["gy"])
    return y.detach(), x.grad


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
    # MultiLevelRoIAlign: levels of stride 2, 4, 8 on a 40 x 48 image; finest_scale 8 sends small boxes to
    # level 0 and large ones to level 2
    levels = [torch.randn(2, 40, 20 // s_, 24 // s_, generator=g, dtype=torch.float64) for s_ in (1, 2, 4)]
    ml_rois = torch.tensor([[0, 2.0, 3.0, 9.0, 8.0], [1, 1.0, 1.0, 20.0, 18.0], [0, 0.0, 0.0, 45.0, 38.0],
                            [1, -10.0, 5.0, 30.0, 60.0], [0, 30.0, 20.0, 31.0, 21.0]], dtype=torch.float64)
    for pooled, ratio, aligned, mode in [((7, 7), 2, True, "avg"), ((3, 3), 0, False, "max"), ((2, 2), 5, True, "avg")]:
        y = multi_level_roi_align(levels, ml_rois, pooled, [2.0, 4.0, 8.0], ratio, 8, 1.0, aligned, mode)
        cases.append({"levels": levels, "rois": ml_rois, "pooled": pooled, "ratio": ratio, "aligned": aligned,
                      "mode": mode, "gy": torch.randn(y.shape, generator=g, dtype=torch.float64)})
    # DeformRoIPool: offsets that move bins partly off the map, none, the plan and the visit (ratio 5, huge box)
    for pooled, ratio, with_offset in [((7, 7), 2, True), ((3, 3), 0, True), ((2, 2), 5, True), ((3, 2), 1, False)]:
        offset = torch.randn(len(rois), 2, *pooled, generator=g, dtype=torch.float64) * 3 if with_offset else None
        y = deform_roi_pool(x, rois, offset, pooled, 0.5, ratio, 0.1)
        cases.append({"x": x, "rois": rois, "pooled": pooled, "ratio": ratio, "offset": offset,
                      "aligned": True, "mode": "avg", "gy": torch.randn(y.shape, generator=g, dtype=torch.float64)})
    # DeformPSRoIPool: output_size 3, output_dim 40 (two channel groups; 2 x 2 input channels each), part_size 3; one
    # class or none (planned), two classes and sample_per_part 5 (the grid-stride kernel); backward through the count
    xp = torch.randn(2, 160, 11, 13, generator=g, dtype=torch.float64)
    for classes, spp in [(0, 4), (1, 2), (2, 4), (1, 5)]:
        trans = torch.randn(len(rois), 2 * classes, 3, 3, generator=g, dtype=torch.float64) if classes else None
        y = deform_psroi_pool(xp, rois, trans, 0.5, 3, 40, 2, 3, spp, 0.2)
        cases.append({"x": xp, "rois": rois, "pooled": (3, 3), "ratio": spp, "trans": trans, "aligned": False,
                      "mode": f"{classes} classes", "gy": torch.randn(y.shape, generator=g, dtype=torch.float64)})
    return cases


def test_cuda_schedule_matches_the_cpu_driver(tmp_path):
    cases = _inputs()
    torch.save(cases, tmp_path / "in.pt")
    env = dict(os.environ, DCNKIT_ROI_CPU_PATH="cuda-schedule")
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], env=env,
                   check=True, timeout=300)
    got = torch.load(tmp_path / "out.pt")
    for a, o in zip(cases, got):
        y, gx = _run_here(a)
        op = "multi-level " if "levels" in a else ("deform " if "offset" in a else ("ps " if "trans" in a else ""))
        what = f"{op}{a['pooled']} ratio {a['ratio']} {a['aligned']} {a['mode']}"
        assert y.abs().sum() > 0, what
        # the same samples in the same order: the forward is bit-identical; the backward adds in another order
        torch.testing.assert_close(o["y"], y, rtol=0, atol=0, msg=lambda m: f"{what}: {m}")
        torch.testing.assert_close(o["gx"], gx, rtol=1e-12, atol=1e-12, msg=lambda m: f"{what} grad: {m}")
