"""Cases of the RoI operators' deterministic backward (tests/test_roi_deterministic.py): RoIAlign, MultiLevelRoIAlign,
DeformRoIPool and DeformPSRoIPool in float64, through the public ops and modules, with large RoIs whose adaptive grid
has far more than 16 samples per bin (sampling_ratio 0 and -1), explicit grids of more than 16 samples (ratio 5),
small, overlapping, partly and wholly outside, inverted and huge (1e5) boxes, two images, avg and max, and max-mode
ties. `run_all()` returns every case's gradients; the test runs it once per DCNKIT_ROI_CPU_PATH value (a child process
each: the variable is read once per process) and once on the default path."""
from __future__ import annotations

import torch

from dcnkit import nn as dnn
from dcnkit.ops import deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align

F64 = torch.float64


def _rois():
    return torch.tensor([[0, 2.0, 3.0, 14.0, 15.0],        # inside
                         [0, 4.0, 5.0, 16.0, 13.0],        # overlaps the first
                         [1, -6.0, -4.0, 9.0, 14.0],       # partly outside
                         [1, 3.0, 3.0, 3.5, 3.2],          # tiny
                         [1, 30.0, 30.0, 40.0, 44.0],      # wholly outside
                         [0, 1.0, 17.0, 19.0, 2.0],        # inverted
                         [0, -20.0, -15.0, 60.0, 50.0],    # large: adaptive grids of 11 x 14 samples per 3x3 bin
                         [1, 1.0, 0.0, 70.0, 66.0],        # large, on the map's far border
                         [0, -1e5, -1e5, 1e5, 1e5]], dtype=F64)  # huge: ~1e5 samples per bin and axis


# RoIAlign: (output_size, sampling_ratio, aligned, mode); the large boxes take every adaptive case past 16 samples.
ROI_ALIGN = [((3, 3), 0, True, "avg"), ((3, 3), -1, False, "avg"), ((2, 3), 0, True, "max"), ((3, 2), -1, False, "max"),
             ((3, 3), 2, True, "max"), ((2, 2), 5, True, "avg"), ((2, 2), 5, False, "max"), ((4, 4), 0, True, "avg")]
# MultiLevelRoIAlign: (output_size, sampling_ratio, aligned, mode) on three maps (strides 2, 4, 8).
MULTI_LEVEL = [((3, 3), 0, True, "avg"), ((2, 3), -1, False, "max"), ((3, 3), -1, True, "avg"), ((2, 2), 0, True, "max"),
               ((2, 2), 5, False, "avg")]


def cases():
    g = torch.Generator().manual_seed(37)
    x = torch.randn(2, 5, 9, 10, generator=g, dtype=F64)
    ties = torch.randint(0, 2, (2, 5, 9, 10), generator=g).to(F64)  # max mode: ties everywhere (the first wins)
    rois = _rois()
    out = []
    for size, ratio, aligned, mode in ROI_ALIGN:
        out.append({"op": "roi_align", "x": x, "rois": rois, "size": size, "ratio": ratio, "aligned": aligned,
                    "mode": mode})
    for ratio in (0, -1):
        out.append({"op": "roi_align", "x": ties, "rois": rois, "size": (3, 3), "ratio": ratio, "aligned": True,
                    "mode": "max"})
    maps = [torch.randn(2, 4, 18, 20, generator=g, dtype=F64), torch.randn(2, 4, 9, 10, generator=g, dtype=F64),
            torch.randn(2, 4, 5, 5, generator=g, dtype=F64)]
    ml_rois = rois * torch.tensor([1.0, 2.0, 2.0, 2.0, 2.0], dtype=F64)  # image coordinates: every level used
    for size, ratio, aligned, mode in MULTI_LEVEL:
        out.append({"op": "multi_level", "maps": maps, "rois": ml_rois, "size": size, "ratio": ratio,
                    "aligned": aligned, "mode": mode})
    offset = torch.randn(rois.shape[0], 2, 3, 3, generator=g, dtype=F64) * 0.3
    for ratio in (0, 2, 5):
        out.append({"op": "deform_roi_pool", "x": x, "rois": rois, "offset": offset, "ratio": ratio})
    out.append({"op": "deform_roi_pool", "x": x, "rois": rois, "offset": None, "ratio": 0})
    xp = torch.randn(2, 3 * 4, 9, 10, generator=g, dtype=F64)  # output_dim 3, group_size 2
    xp6 = torch.randn(2, 6 * 4, 9, 10, generator=g, dtype=F64)  # output_dim 6: two classes of 3
    t1 = torch.randn(rois.shape[0], 2, 3, 3, generator=g, dtype=F64) * 0.5
    t2 = torch.randn(rois.shape[0], 4, 3, 3, generator=g, dtype=F64) * 0.5
    for xx, trans, dim, spp in ((xp, None, 3, 2), (xp, t1, 3, 4), (xp6, t2, 6, 5), (xp6, t2, 6, 2)):
        out.append({"op": "deform_psroi_pool", "x": xx, "rois": rois, "trans": trans, "dim": dim, "spp": spp})
    for c in out:  # the output gradient: fixed per case
        c["gy"] = torch.randn(forward(c, dict(c)).shape, generator=g, dtype=F64)
    return out


def forward(c, leaves):
    """The case's op through the public functions on `leaves` (the differentiable tensors)."""
    if c["op"] == "roi_align":
        return roi_align(leaves["x"], c["rois"], c["size"], 0.5, c["ratio"], c["aligned"], c["mode"])
    if c["op"] == "multi_level":
        return multi_level_roi_align(leaves["maps"], c["rois"], c["size"], [2.0, 4.0, 8.0], c["ratio"], 8, 1.0,
                                     c["aligned"], c["mode"])
    if c["op"] == "deform_roi_pool":
        return deform_roi_pool(leaves["x"], c["rois"], leaves.get("offset"), 3, 0.5, c["ratio"], 0.1)
    return deform_psroi_pool(leaves["x"], c["rois"], leaves.get("trans"), 0.5, 3, c["dim"], 2, 3, c["spp"], 0.2)


def gradients(c):
    """The case's input gradients (and offset / trans gradients) in a fixed order."""
    leaves = {}
    for k in ("x", "offset", "trans"):
        if c.get(k) is not None:
            leaves[k] = c[k].clone().requires_grad_()
    if "maps" in c:
        leaves["maps"] = [m.clone().requires_grad_() for m in c["maps"]]
    forward(c, leaves).backward(c["gy"])
    flat = [leaves[k].grad for k in ("x", "offset", "trans") if k in leaves]
    return flat + [m.grad for m in leaves.get("maps", [])]


def module_gradients():
    """The modules of the acceptance check: nn.RoIAlign, nn.MultiLevelRoIAlign and nn.MultiScaleRoIAlign (torchvision's
    sampling_ratio -1 and detectron2's / mmdet's 0) on large RoIs, avg and max where the module has both."""
    g = torch.Generator().manual_seed(38)
    x = torch.randn(2, 3, 12, 13, generator=g, dtype=F64)
    rois = torch.tensor([[0, -8.0, -6.0, 50.0, 44.0], [1, 2.0, 1.0, 40.0, 30.0], [0, 5.0, 5.0, 9.0, 8.0]], dtype=F64)
    maps = [torch.randn(2, 3, 16, 18, generator=g, dtype=F64), torch.randn(2, 3, 8, 9, generator=g, dtype=F64)]
    out = []
    for ratio in (0, -1):
        for mode in ("avg", "max"):
            m = dnn.RoIAlign((2, 2), 0.5, ratio, mode, True)
            xx = x.clone().requires_grad_()
            y = m(xx, rois)
            y.backward(torch.ones_like(y))
            out.append(xx.grad)
            ml = dnn.MultiLevelRoIAlign(2, [4.0, 8.0], ratio, 8, True, mode)
            ms = [t.clone().requires_grad_() for t in maps]
            y = ml(ms, rois * torch.tensor([1.0, 2.0, 2.0, 2.0, 2.0], dtype=F64))
            y.backward(torch.ones_like(y))
            out.extend(t.grad for t in ms)
        msr = dnn.MultiScaleRoIAlign(["p2", "p3"], 2, ratio)
        ms = [t.clone().requires_grad_() for t in maps]
        boxes = [rois[rois[:, 0] == b, 1:] * 4 for b in (0, 1)]
        y = msr({"p2": ms[0], "p3": ms[1]}, boxes, [(64, 72), (64, 72)])
        y.backward(torch.ones_like(y))
        out.extend(t.grad for t in ms)
    return out


def run_all(deterministic=True):
    """Every case's gradients, then the modules', with torch.use_deterministic_algorithms(deterministic)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic)
    try:
        return [gradients(c) for c in cases()], module_gradients()
    finally:
        torch.use_deterministic_algorithms(before)
