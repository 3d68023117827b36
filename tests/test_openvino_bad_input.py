"""The OpenVINO backend on bad input (docs/openvino.md, "Bad input"): every mapping keeps docs/operators.md's rows.

- DeformPSRoIPool with static shapes and output_size == group_size (once OpenVINO's DeformablePSROIPooling-1, which
  read outside the input for a batch index of -2 or N, zeroed the RoIs after one of -1 and crashed the process on a
  NaN box, batch index or offset) names the bad batch index as ONNX Runtime does, and gives ONNX Runtime's answer
  for NaN coordinates and offsets;
- an error inside an extension operation reaches the caller with one inference thread too (OpenVINO 2026.4's
  synchronous infer() drops it; the runner infers with start_async() + wait(), and the operation leaves NaN, not
  uninitialised memory, in its outputs for callers that use infer());
- int64 level tables keep their values (OpenVINO narrows int64 to int32): a graph input past int32 that only the
  kit's operations read runs as an int64 constant, one that OpenVINO's own operations read is refused by name;
- ONNX RoiAlign moved to the kit's kernel follows the model's float type (float16, float64) and takes K = 0 RoIs
  with static shapes; a max RoiAlign (OpenVINO's own) refuses a negative batch index instead of leaving the rest of
  its output unwritten.
Each case runs in a subprocess where a crash would otherwise take the test run down."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install dcnkit[openvino])")

from dcnkit.runtime.openvino import openvino_reason  # noqa: E402

pytestmark = pytest.mark.skipif(openvino_reason() is not None, reason=f"openvino backend: {openvino_reason()}")

F32, I64 = TensorProto.FLOAT, TensorProto.INT64
BAD_INDEX = r"rois\[{k}, 0\] \(batch index\): expected a value in \[0, {n}\)"


def _model(nodes, inputs, outputs=("y",), inits=(), opsets=(("", 17), ("dcnkit", 1)), out_type=F32):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(o, out_type, None) for o in outputs],
                              initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=9)


def _run_isolated(model, feeds, backend="openvino", **options):
    """(outputs, None) or (None, error text) of one run in a fresh interpreter; a crash fails the test."""
    script = textwrap.dedent("""
        import json, sys, numpy as np
        from dcnkit.runtime.registry import make_runner
        folder, backend, options = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
        feeds = dict(np.load(folder + "/feeds.npz"))
        try:
            with make_runner(folder + "/model.onnx", backend=backend, **options) as r:
                np.savez(folder + "/out.npz", **r.run(feeds))
        except Exception as e:
            open(folder + "/error.txt", "w").write(str(e))
    """)
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "model.onnx").write_bytes(model.SerializeToString())
        np.savez(Path(folder) / "feeds.npz", **feeds)
        p = subprocess.run([sys.executable, "-c", script, folder, backend, json.dumps(options)], capture_output=True,
                           timeout=120)
        assert p.returncode == 0, f"the run crashed (exit {p.returncode}): {p.stderr.decode()[-2000:]}"
        if (Path(folder) / "error.txt").exists():
            return None, (Path(folder) / "error.txt").read_text()
        return dict(np.load(Path(folder) / "out.npz")), None


def _psroi(k, trans=False):
    """A static DeformPSRoIPool with output_size == group_size (the shape OpenVINO's own op took)."""
    inputs = [("x", F32, [2, 4, 5, 6]), ("rois", F32, [k, 5])] + ([("t", F32, [k, 2, 2, 2])] if trans else [])
    node = helper.make_node("DeformPSRoIPool", [i[0] for i in inputs], ["y"], domain="dcnkit", name="ps",
                            spatial_scale=0.5, output_size=2, output_dim=1, group_size=2, sample_per_part=2,
                            trans_std=0.1, no_trans=int(not trans))
    return _model([node], inputs)


@pytest.mark.parametrize("rows, bad_row", [([[-2, 1, 1, 6, 6]], 0), ([[-1, 1, 1, 6, 6], [0, 1, 1, 6, 6]], 0),
                                           ([[0, 1, 1, 6, 6], [2, 1, 1, 6, 6]], 1), ([[np.nan, 0, 0, 2, 0]], 0),
                                           ([[1e12, 0, 0, 2, 0]], 0)],
                         ids=["minus-two", "minus-one-before-a-valid-roi", "N", "nan", "1e12"])
def test_psroi_bad_batch_index_is_named_as_on_onnx_runtime(rows, bad_row):
    rois = np.array(rows, np.float32)
    feeds = {"x": np.ones((2, 4, 5, 6), np.float32), "rois": rois}
    out, err = _run_isolated(_psroi(len(rows)), feeds)
    assert out is None, f"expected an error, got {out}"
    assert re.search(BAD_INDEX.format(k=bad_row, n=2), err), err
    _, ort_err = _run_isolated(_psroi(len(rows)), feeds, backend="ort-cpu")
    assert re.search(BAD_INDEX.format(k=bad_row, n=2), ort_err), ort_err


@pytest.mark.parametrize("what", ["nan-coordinate", "inf-coordinate", "nan-offset", "inf-offset"])
def test_psroi_nan_and_inf_give_onnx_runtimes_answer(what):
    rng = np.random.default_rng(0)
    rois = np.array([[0, 1, 1, 6, 6], [1, 0.5, 2, 4, 5]], np.float32)
    trans = (rng.standard_normal((2, 2, 2, 2)) * 0.5).astype(np.float32)
    if "coordinate" in what:
        rois[0, 2] = np.nan if what.startswith("nan") else np.inf
    else:
        trans[0, 0, 1, 1] = np.nan if what.startswith("nan") else np.inf
    feeds = {"x": rng.standard_normal((2, 4, 5, 6)).astype(np.float32), "rois": rois, "t": trans}
    want, err = _run_isolated(_psroi(2, trans=True), feeds, backend="ort-cpu")
    assert err is None, err
    got, err = _run_isolated(_psroi(2, trans=True), feeds)
    assert err is None, err
    np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-5, equal_nan=True)


def _roi_align(n=1):
    node = helper.make_node("RoIAlign", ["x", "rois"], ["y"], domain="dcnkit", name="r", output_size=[2, 2])
    return _model([node], [("x", F32, [n, 1, 4, 4]), ("rois", F32, [1, 5])])


@pytest.mark.parametrize("num_threads", [1, 2, None])
def test_an_operations_error_reaches_the_caller_on_any_thread_count(num_threads):
    from dcnkit.runtime.registry import make_runner

    feeds = {"x": np.ones((1, 1, 4, 4), np.float32), "rois": np.array([[2, 0, 0, 3, 3]], np.float32)}
    with make_runner(_roi_align(), backend="openvino", num_threads=num_threads) as runner:
        with pytest.raises(RuntimeError, match=BAD_INDEX.format(k=0, n=1)):
            runner.run(feeds)
        # OpenVINO's own synchronous infer() (the call plain OpenVINO users make): an error, or NaN where OpenVINO
        # 2026.4 loses it on one thread; never the uninitialised memory it returned before.
        request = runner.compiled.create_infer_request()
        try:
            request.infer(feeds)
        except RuntimeError as e:
            assert "batch index" in str(e)
        else:
            assert np.isnan(request.get_output_tensor(0).data).all()


def _msda(tables_as_inputs: bool, shapes: np.ndarray, starts: np.ndarray):
    L = shapes.shape[0]
    inputs = [("value", F32, [1, 6, 1, 2]), ("loc", F32, [1, 2, 1, L, 1, 2]), ("attn", F32, [1, 2, 1, L, 1])]
    inits = []
    if tables_as_inputs:
        inputs += [("shapes", I64, [L, 2]), ("starts", I64, [L])]
    else:
        inits = [numpy_helper.from_array(shapes, "shapes"), numpy_helper.from_array(starts, "starts")]
    node = helper.make_node("MultiScaleDeformableAttention", ["value", "shapes", "starts", "loc", "attn"], ["y"],
                            domain="dcnkit", name="m")
    return _model([node], inputs, inits=inits)


@pytest.mark.parametrize("tables_as_inputs", [True, False], ids=["graph-inputs", "constants"])
def test_int64_tables_keep_their_values(tables_as_inputs):
    rng = np.random.default_rng(1)
    for shapes, starts in ((np.array([[2**31, 0], [2, 3]]), np.array([0, 0])),  # a valid empty level past int32
                           (np.array([[2**32 + 2, 3]]), np.array([0]))):         # 2^32 + 2 rows: refused as such
        L = shapes.shape[0]
        feeds = {"value": rng.standard_normal((1, 6, 1, 2)).astype(np.float32),
                 "loc": rng.random((1, 2, 1, L, 1, 2)).astype(np.float32),
                 "attn": rng.random((1, 2, 1, L, 1)).astype(np.float32)}
        if tables_as_inputs:
            feeds.update(shapes=shapes.astype(np.int64), starts=starts.astype(np.int64))
        model = _msda(tables_as_inputs, shapes.astype(np.int64), starts.astype(np.int64))
        want, want_err = _run_isolated(model, feeds, backend="ort-cpu")
        got, err = _run_isolated(model, feeds)
        if want_err is None:
            assert err is None, err
            np.testing.assert_allclose(got["y"], want["y"], rtol=1e-5, atol=1e-6)
        else:
            assert "(H, W) = (4294967298, 3)" in want_err and got is None and "(H, W) = (4294967298, 3)" in err, err


def test_a_wide_int64_input_that_openvino_reads_itself_is_refused_by_name():
    from dcnkit.runtime.registry import make_runner

    node = helper.make_node("Add", ["a", "b"], ["y"])
    model = _model([node], [("a", I64, [2]), ("b", I64, [2])], opsets=(("", 17),), out_type=I64)
    with make_runner(model, backend="openvino") as runner:
        np.testing.assert_array_equal(runner.run({"a": np.array([1, 2]), "b": np.array([3, 4])})["y"], [4, 6])
        with pytest.raises(ValueError, match=r"feeds\['a'\]: expected int64 values in \[-2\^31, 2\^31\).*got 4294967296"):
            runner.run({"a": np.array([1, 2**32]), "b": np.array([3, 4])})


def _onnx_roi_align(dtype, k=1, mode="avg", opset=16):
    t = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], name="r", mode=mode, output_height=2,
                            output_width=2, sampling_ratio=2, spatial_scale=0.5)
    return _model([node], [("x", t, [2, 3, 6, 7]), ("rois", t, [k, 4]), ("bi", I64, [k])], opsets=(("", opset),),
                  out_type=t)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_roi_align_of_any_float_type_loads_runs_and_converts(dtype, tmp_path):
    from dcnkit.cli import main
    from dcnkit.runtime.registry import make_runner

    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 3, 6, 7)).astype(dtype),
             "rois": np.array([[0.5, 1.0, 9.0, 11.0], [2.0, 0.0, 13.0, 6.5]], dtype),
             "bi": np.array([1, 0], np.int64)}
    model = _onnx_roi_align(dtype, k=2)
    with make_runner(model, backend="ort-cpu") as runner:
        want = runner.run(feeds)["y"]
    with make_runner(model, backend="openvino") as runner:
        assert runner.rewritten == 0  # (the count is of DeformConv nodes)
        got = runner.run(feeds)["y"]
    assert got.dtype == dtype
    tol = 5e-3 if dtype == np.float16 else 1e-5
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)
    path = tmp_path / "ra.onnx"
    path.write_bytes(model.SerializeToString())
    assert main(["convert", str(path), "--to", "openvino", "-o", str(tmp_path / "ir")]) == 0
    with make_runner(tmp_path / "ir", backend="openvino") as runner:
        np.testing.assert_allclose(runner.run(feeds)["y"].astype(np.float64), got.astype(np.float64), rtol=tol,
                                   atol=tol)


@pytest.mark.parametrize("opset", [10, 16])
def test_no_rois_with_static_shapes(opset):
    from dcnkit.runtime.registry import make_runner

    feeds = {"x": np.ones((2, 3, 6, 7), np.float32), "rois": np.zeros((0, 4), np.float32),
             "bi": np.zeros(0, np.int64)}
    with make_runner(_onnx_roi_align(np.float32, k=0, opset=opset), backend="openvino") as runner:
        assert runner.run(feeds)["y"].shape == (0, 3, 2, 2)


@pytest.mark.parametrize("bi", [[0, -1], [-1, 0], [0, -3], [0, 2]])
def test_max_roi_align_refuses_a_bad_batch_index(bi):
    feeds = {"x": np.ones((2, 3, 6, 7), np.float32), "rois": np.array([[0, 0, 5, 5], [1, 1, 4, 4]], np.float32),
             "bi": np.array(bi, np.int64)}
    out, err = _run_isolated(_onnx_roi_align(np.float32, k=2, mode="max"), feeds)
    assert out is None and "ROIAlign" in err, out
