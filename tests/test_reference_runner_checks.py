"""The reference runner (dcnkit.runtime.reference_runner) on bad and wild input: it checks a node as the kernels do
(the same errors as ONNX Runtime for a sampling ratio of 2^30 or a kernel of 2^31 - 1), bounds its work (a box of
1e12 pixels with an adaptive grid returns, with ONNX Runtime's result: the samples are placed in the kernels'
float32, so the same ones land on the map), gives NaN boxes the contract's answer, runs every name of DeformConv2d
and ONNX's own max RoiAlign; and the bounded NumPy references (dcnkit._reference_roi) equal the C++ kernels (float64,
through the torch ops) on maps with Inf and NaN and boxes up to 1e6 pixels."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from dcnkit import ops
from dcnkit import reference as R

F32 = TensorProto.FLOAT


def _model(op_type, inputs, domain="dcnkit", outputs=("y",), opset=17, **attrs):
    node = helper.make_node(op_type, [n for n, _ in inputs], list(outputs), name="n", domain=domain, **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F32, s) for n, s in inputs],
                              [helper.make_tensor_value_info(o, F32, None) for o in outputs])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


def _run(model, feeds, backend):
    from dcnkit.runtime.registry import make_runner

    with make_runner(model, backend=backend) as runner:
        return runner.run(feeds)


def _error(model, feeds, backend) -> str:
    try:
        _run(model, feeds, backend)
    except Exception as e:  # noqa: BLE001 - the message is the result
        return str(e)
    raise AssertionError(f"{backend}: expected an error")


@pytest.mark.parametrize("attrs, message", [
    (dict(sampling_ratio=2**30), "sampling_ratio: expected a value <= 1024"),
    (dict(spatial_scale=float("nan")), "spatial_scale: expected a finite value > 0, got nan"),
    (dict(output_size=[0, 2]), "output_size: expected (oh, ow) >= 1"),
])
def test_bad_attributes_are_the_kernels_errors(attrs, message):
    model = _model("RoIAlign", [("x", [1, 2, 5, 5]), ("rois", [1, 5])], **attrs)
    feeds = {"x": np.ones((1, 2, 5, 5), np.float32), "rois": np.array([[0, 0, 0, 4, 4]], np.float32)}
    assert message in _error(model, feeds, "reference")
    assert message in _error(model, feeds, "ort-cpu")


def _dcnv3(kernel_h, pad_h, n=0):
    attrs = dict(kernel_h=kernel_h, kernel_w=1, stride_h=1, stride_w=1, pad_h=pad_h, pad_w=0, dilation_h=1,
                 dilation_w=1, group=1, group_channels=2, offset_scale=1.0, remove_center=0)
    shapes = {"x": (n, 3, 4, 2), "offset": (n, 3, 4, 2 * kernel_h), "mask": (n, 3, 4, kernel_h)}
    model = _model("DCNv3", [(k, list(v)) for k, v in shapes.items()], **attrs)
    return model, {k: np.zeros(v, np.float32) for k, v in shapes.items()}


def test_huge_kernels_are_the_kernels_answer():
    """A kernel of 2^31 - 1 points: the kernels' error; one of 2^24 - 1 (within their limit) on an empty batch: an empty output,
    at once (the reference's loops over the kernel points never start)."""
    model, feeds = _dcnv3(2**31 - 1, 2**30)
    message = "kernel_h: expected an int in [1, 2^24], got 2147483647"
    assert message in _error(model, feeds, "reference") and message in _error(model, feeds, "ort-cpu")
    model, feeds = _dcnv3(2**24 - 1, 2**23 - 1)
    assert _run(model, feeds, "reference")["y"].shape == _run(model, feeds, "ort-cpu")["y"].shape == (0, 3, 4, 2)


HUGE = """
import numpy as np
from onnx import TensorProto, helper
from dcnkit.runtime.registry import make_runner
rng = np.random.default_rng(0)
x = rng.standard_normal((1, 2, 8, 8)).astype(np.float32)
rois = np.array([[0, -1e12, -1e12, 1e12, 1.5e12], [0, -3e6, 2, 9, 1e6], [0, 1, 1, 5, 6]], np.float32)
res = {}
for mode in ("avg", "max"):
    node = helper.make_node("RoIAlign", ["x", "rois"], ["y"], domain="dcnkit", output_size=[3, 2],
                            spatial_scale=0.5, sampling_ratio=0, aligned=1, pool_mode=mode)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape),
                                            helper.make_tensor_value_info("rois", TensorProto.FLOAT, rois.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                              ir_version=9)
    for backend in ("reference", "ort-cpu"):
        with make_runner(model, backend=backend) as r:
            res[f"{mode}_{backend}"] = r.run({"x": x, "rois": rois})["y"]
np.savez(OUT, **res)
"""


def test_huge_boxes_return_onnx_runtimes_result(tmp_path):
    """Boxes of 1e12 pixels, adaptive grids (~1e11 samples per bin): before its bound the reference ran for hours.
    In max mode the answer depends on which float32 sample positions land on the map."""
    out = tmp_path / "out.npz"
    p = subprocess.run([sys.executable, "-c", f"OUT = {str(out)!r}\n" + textwrap.dedent(HUGE)], capture_output=True,
                       text=True, timeout=120, env=dict(os.environ))
    assert p.returncode == 0, p.stderr[-3000:]
    res = np.load(out)
    for mode in ("avg", "max"):
        np.testing.assert_allclose(res[f"{mode}_reference"], res[f"{mode}_ort-cpu"], rtol=1e-5, atol=1e-6,
                                   err_msg=mode)


def test_nan_boxes_get_the_contract_answer():
    rois = np.array([[0, np.nan, 3, 20, 30], [0, 2, 2, np.inf, 40], [0, 4, 4, 30, 20]], np.float32)
    feeds = {"rois": rois, "f0": np.ones((1, 2, 8, 8), np.float32), "f1": np.ones((1, 2, 4, 4), np.float32)}
    model = _model("MultiLevelRoIAlign", [("rois", [3, 5]), ("f0", [1, 2, 8, 8]), ("f1", [1, 2, 4, 4])],
                   output_size=[2, 2], featmap_strides=[4.0, 8.0], finest_scale=8)
    want = _run(model, feeds, "ort-cpu")["y"]
    np.testing.assert_allclose(_run(model, feeds, "reference")["y"], want, rtol=1e-5, atol=1e-6)
    assert np.all(want[0] == 0) and np.all(want[2] > 0)


@pytest.mark.parametrize("domain", ["mmcv", "mmdeploy"])
def test_every_name_of_deform_conv2d_runs(domain):
    rng = np.random.default_rng(3)
    shapes = {"x": (1, 4, 6, 6), "offset": (1, 18, 6, 6), "mask": (1, 9, 6, 6), "w": (3, 4, 3, 3), "b": (3,)}
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    model = _model("MMCVModulatedDeformConv2d", [(k, list(s)) for k, s in shapes.items()], domain=domain,
                   stride=[1, 1], padding=[1, 1, 1, 1], dilation=[1, 1], groups=1, deform_groups=1)
    np.testing.assert_allclose(_run(model, feeds, "reference")["y"], _run(model, feeds, "ort-cpu")["y"], rtol=1e-4,
                               atol=1e-4)
    no_mask = _model("MMCVModulatedDeformConv2d", [(k, list(shapes[k])) for k in ("x", "offset")] + [("w", [3, 4, 3, 3])],
                     domain=domain, stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=1)
    no_mask.graph.node[0].input[:] = ["x", "offset", "", "w"]
    assert "mask: expected a tensor, got no input" in _error(no_mask, {k: feeds[k] for k in ("x", "offset", "w")},
                                                             "reference")


def test_onnx_max_roi_align_is_onnxs_own_function():
    """ONNX's max RoiAlign takes the largest weighted corner value (not the kit's max): the reference computes it."""
    rng = np.random.default_rng(0)
    node_inputs = [("x", [1, 2, 6, 6]), ("rois", [3, 4])]
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], mode="max", output_height=2, output_width=2,
                            sampling_ratio=2)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F32, s) for n, s in node_inputs]
                              + [helper.make_tensor_value_info("bi", TensorProto.INT64, [3])],
                              [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 16)], ir_version=9)
    feeds = {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32),
             "rois": np.array([[0.3, 0.2, 4.1, 5.3], [-2, -1, 3, 2], [1, 1, 1.5, 1.7]], np.float32),
             "bi": np.zeros(3, np.int64)}
    want = _run(model, feeds, "ort-cpu")["y"]
    np.testing.assert_allclose(_run(model, feeds, "reference")["y"], want, rtol=1e-5, atol=1e-6)
    kit_max = R.roi_align(feeds["x"], np.concatenate([np.zeros((3, 1), np.float32), feeds["rois"]], 1), (2, 2), 1.0,
                          2, True, "max")
    assert not np.allclose(kit_max, want, atol=1e-3)  # a different function: the test can tell them apart


def _wild_case(rng):
    n, c, h, w = 2, int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(1, 7))
    x = rng.standard_normal((n, c, h, w))
    for v in (np.inf, -np.inf, np.nan):
        if rng.random() < 0.5:
            x[rng.integers(0, n), rng.integers(0, c), rng.integers(0, h), rng.integers(0, w)] = v
    k = int(rng.integers(1, 4))
    rois = np.concatenate([rng.integers(0, n, (k, 1)),
                           rng.uniform(-3, 9, (k, 4)) * rng.choice([1, 1, 0.5, 3, 1e6], (k, 4))], 1)
    rois = np.where(rng.random((k, 5)) < 0.2, np.round(rois), rois)
    rois[:, 0] = np.abs(rois[:, 0]) % n // 1
    if rng.random() < 0.15:
        rois[0, rng.integers(1, 5)] = rng.choice([np.nan, np.inf, -np.inf])
    return x, rois, dict(size=(int(rng.integers(1, 4)), int(rng.integers(1, 4))), scale=float(rng.choice([1, 0.5, 0.3])),
                         ratio=int(rng.choice([0, -1, 1, 2, 3, 40])), aligned=bool(rng.integers(0, 2)),
                         mode=["avg", "max"][int(rng.integers(0, 2))])


def _same(a, b, tol=1e-9):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape
    np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol * max(1.0, float(np.nanmax(np.abs(np.where(np.isinf(b), 0, b)),
                                                                                  initial=0))))


@pytest.mark.parametrize("op", ["roi_align", "deform_roi_pool", "roi_align_rotated", "multi_level_roi_align",
                                "deform_psroi_pool"])
def test_bounded_references_equal_the_kernels(op):
    rng = np.random.default_rng(["roi_align", "deform_roi_pool", "roi_align_rotated", "multi_level_roi_align",
                                 "deform_psroi_pool"].index(op))
    T = torch.from_numpy
    for _ in range(60):
        x, rois, a = _wild_case(rng)
        size, scale, ratio = a["size"], a["scale"], a["ratio"]
        if op == "roi_align":
            got = R.roi_align(x, rois, size, scale, ratio, a["aligned"], a["mode"])
            want = ops.roi_align(T(x), T(rois), size, scale, ratio, a["aligned"], a["mode"])
        elif op == "deform_roi_pool":
            off = rng.standard_normal((len(rois), 2, *size))
            got = R.deform_roi_pool(x, rois, off, size, scale, ratio, 0.1)
            want = ops.deform_roi_pool(T(x), T(rois), T(off), size, scale, ratio, 0.1)
        elif op == "roi_align_rotated":
            rr = np.concatenate([rois[:, :3], np.abs(rois[:, 3:5]), rng.uniform(-4, 4, (len(rois), 1))], 1)
            clockwise = bool(rng.integers(0, 2))
            got = R.roi_align_rotated(x, rr, size, scale, ratio, a["aligned"], clockwise)
            want = ops.roi_align_rotated(T(x), T(rr), size, scale, ratio, a["aligned"], clockwise)
        elif op == "multi_level_roi_align":
            feats = [x, x[:, :, ::2, ::2].copy()]
            boxes = rois * [1, 8, 8, 8, 8]
            got = R.multi_level_roi_align(feats, boxes, size, [2.0, 4.0], ratio, 4, 1.3, a["aligned"], a["mode"])
            want = ops.multi_level_roi_align([T(f) for f in feats], T(boxes), size, [2.0, 4.0], ratio, 4, 1.3,
                                             a["aligned"], a["mode"])
        else:
            gs, P = int(rng.integers(1, 3)), int(rng.integers(1, 4))
            xp = np.repeat(x[:, :1], 2 * gs * gs, axis=1)
            tr = rng.standard_normal((len(rois), 2, P, P)) * rng.choice([0.3, 3.0])
            spp = int(rng.choice([1, 2, 4, 300]))
            got = R.deform_psroi_pool(xp, rois, tr, scale, P, 2, gs, None, spp, 0.2)[0]
            want = ops.deform_psroi_pool(T(xp), T(rois), T(tr), scale, P, 2, gs, None, spp, 0.2)
        _same(got, want.numpy())
