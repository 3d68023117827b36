"""dcnkit triton-repo: the written repository against Triton's own config schema.

The config is parsed with protobuf's text-format parser into tritonclient's ``model_config_pb2.ModelConfig``
(dcnkit.runtime.triton.parse_config): unknown fields, wrong types and bad enum names fail. On top, the fields
Triton's onnxruntime backend needs are checked one by one. (Loading in a real tritonserver: test_triton_python_repo.)
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper  # noqa: E402

from dcnkit.runtime import triton  # noqa: E402
from dcnkit.server.cli import main as cli_main  # noqa: E402


def _batch_model(dim0="batch"):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [dim0, 3, 8, 8])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT16, [dim0, 1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [dim0, 3, 8, 8])
    n = helper.make_node("Relu", ["x"], ["y"])
    m = helper.make_node("Identity", ["s"], ["s_out"])
    so = helper.make_tensor_value_info("s_out", TensorProto.FLOAT16, [dim0, 1])
    g = helper.make_graph([n, m], "g", [x, s], [y, so])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def _roi_model(custom: bool):
    """An RoI model; with ``custom`` its node is the kit's dcnkit::RoIAlign (domain "dcnkit")."""
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 4, 16, 16])
    rois = helper.make_tensor_value_info("rois", TensorProto.FLOAT, ["K", 5])
    out = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["K", 4, 2, 2])
    if custom:
        node = helper.make_node("RoIAlign", ["input", "rois"], ["output"], domain="dcnkit", output_size=[2, 2],
                                spatial_scale=1.0, sampling_ratio=2, aligned=1)
        opsets = [helper.make_opsetid("", 18), helper.make_opsetid("dcnkit", 1)]
    else:
        node = helper.make_node("Identity", ["input"], ["output"])
        opsets = [helper.make_opsetid("", 18)]
    g = helper.make_graph([node], "roi", [x, rois], [out])
    model = helper.make_model(g, opset_imports=opsets)
    model.ir_version = 9
    return model


def _parse(model_dir):
    return triton.parse_config((model_dir / "config.pbtxt").read_text())


def test_batched_model_repository(tmp_path):
    path = tmp_path / "seg_net.onnx"
    onnx.save(_batch_model(), str(path))
    d = triton.write_repository(path, tmp_path / "repo", max_batch_size=16, preferred_batch_sizes=[4, 8],
                                max_queue_delay_us=500, max_queue_size=32, instance_kind="KIND_GPU",
                                instance_count=2)
    assert d == tmp_path / "repo" / "seg_net"  # name from the file's stem
    assert sorted(p.name for p in d.iterdir()) == ["1", "config.pbtxt"]  # standard ops: no library
    cfg = _parse(d)
    assert cfg.name == "seg_net" and cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 16
    assert [(i.name, i.data_type, list(i.dims)) for i in cfg.input] == [("x", 11, [3, 8, 8]), ("s", 10, [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in cfg.output] == [("y", 11, [3, 8, 8]), ("s_out", 10, [1])]
    assert list(cfg.dynamic_batching.preferred_batch_size) == [4, 8]
    assert cfg.dynamic_batching.max_queue_delay_microseconds == 500
    assert cfg.dynamic_batching.default_queue_policy.max_queue_size == 32
    assert cfg.instance_group[0].kind == 1 and cfg.instance_group[0].count == 2  # KIND_GPU
    assert not cfg.HasField("model_operations")
    text = (d / "config.pbtxt").read_text()
    assert re.search(r"data_type: TYPE_FP32", text) and re.search(r"data_type: TYPE_FP16", text)
    saved = onnx.load(str(d / "1" / "model.onnx"))
    assert saved.graph == _batch_model().graph
    assert triton.check_repository(d) == []


def test_default_batch_size_and_unbatchable_models(tmp_path):
    d = triton.write_repository(_batch_model(), tmp_path, name="a")
    assert _parse(d).max_batch_size == triton.DEFAULT_MAX_BATCH_SIZE
    # An RoI model: inputs N / K do not share a batch dim -> max_batch_size 0, full dims, no dynamic batching.
    d = triton.write_repository(_roi_model(False), tmp_path, name="roi")
    cfg = _parse(d)
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")
    assert [list(i.dims) for i in cfg.input] == [[-1, 4, 16, 16], [-1, 5]]
    assert triton.check_repository(d) == []
    with pytest.raises(ValueError, match=r"max_batch_size: expected 0 for this model \(the first dims differ "
                                         r"\(input: N, rois: K, output: K\).*got 4"):
        triton.write_repository(_roi_model(False), tmp_path, name="roi2", max_batch_size=4)
    # A fixed first dim cannot be batched either.
    with pytest.raises(ValueError, match=r"input 'x' has a fixed first dim \(1\)"):
        triton.write_repository(_batch_model(dim0=1), tmp_path, name="fixed", max_batch_size=2)
    d = triton.write_repository(_batch_model(dim0=1), tmp_path, name="fixed")
    assert _parse(d).max_batch_size == 0 and list(_parse(d).input[0].dims) == [1, 3, 8, 8]


def test_custom_op_model_references_the_library(tmp_path, monkeypatch):
    fake_lib = tmp_path / "libdcnkit_ort.so"
    fake_lib.write_bytes(b"\x7fELF fake")
    import dcnkit

    monkeypatch.setattr(dcnkit, "ort_library", lambda: str(fake_lib))
    d = triton.write_repository(_roi_model(True), tmp_path / "repo", name="roi_head")
    cfg = _parse(d)
    assert list(cfg.model_operations.op_library_filename) == ["/models/roi_head/libdcnkit_ort.so"]
    assert (d / "libdcnkit_ort.so").read_bytes() == b"\x7fELF fake"
    assert triton.check_repository(d) == []
    d = triton.write_repository(_roi_model(True), tmp_path / "repo2", name="r", container_repository="/srv/repo")
    assert list(_parse(d).model_operations.op_library_filename) == ["/srv/repo/r/libdcnkit_ort.so"]
    d = triton.write_repository(_roi_model(True), tmp_path / "repo3", name="r",
                                library_path="/opt/dcnkit/lib/libdcnkit_ort.so")
    assert list(_parse(d).model_operations.op_library_filename) == ["/opt/dcnkit/lib/libdcnkit_ort.so"]
    assert not (d / "libdcnkit_ort.so").exists()


def _deform_conv_model(domain="", op_type="DeformConv", in_subgraph=False):
    """A model with one deformable node: standard DeformConv by default (inside an If branch with ``in_subgraph``)."""
    f = TensorProto.FLOAT
    ins = [helper.make_tensor_value_info(n, f, None) for n in ("x", "w", "offset")]
    out = helper.make_tensor_value_info("y", f, None)
    node = helper.make_node(op_type, ["x", "w", "offset"], ["y"], domain=domain, pads=[1, 1, 1, 1])
    opsets = [helper.make_opsetid("", 19)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    if in_subgraph:
        branch = helper.make_graph([node], "b", [], [out])
        cond = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
        node = helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
        ins.append(cond)
    model = helper.make_model(helper.make_graph([node], "g", ins, [out]), opset_imports=opsets)
    model.ir_version = 9
    return model


@pytest.mark.parametrize("model", [_deform_conv_model(), _deform_conv_model(in_subgraph=True),
                                   _deform_conv_model("mmdeploy", "MMCVModulatedDeformConv2d")],
                         ids=["standard", "standard-in-If", "mmdeploy"])
def test_every_model_with_deformable_nodes_gets_the_library(tmp_path, monkeypatch, model):
    """Standard DeformConv included (issue 35): the library runs it where the container's ONNX Runtime has no kernel
    for it (before 1.26); mmdeploy's and mmcv's names are the library's too."""
    fake_lib = tmp_path / "libdcnkit_ort.so"
    fake_lib.write_bytes(b"\x7fELF fake")
    import dcnkit

    monkeypatch.setattr(dcnkit, "ort_library", lambda: str(fake_lib))
    d = triton.write_repository(model, tmp_path / "repo", name="dcn", max_batch_size=0)
    assert list(_parse(d).model_operations.op_library_filename) == ["/models/dcn/libdcnkit_ort.so"]
    assert (d / "libdcnkit_ort.so").is_file()
    d = triton.write_repository(_roi_model(False), tmp_path / "plain", name="p")  # no deformable node: no library
    assert not _parse(d).model_operations.op_library_filename and not (d / "libdcnkit_ort.so").exists()


def test_real_library_is_copied(tmp_path):
    import dcnkit

    try:
        lib = dcnkit.ort_library()
    except FileNotFoundError:
        pytest.skip("the kit's ONNX Runtime library is not built here")
    d = triton.write_repository(_roi_model(True), tmp_path, name="r")
    copied = d / triton.LIBRARY_FILENAME
    assert copied.stat().st_size == os.path.getsize(lib)
    # Its private dependencies (OpenBLAS from a wheel) sit beside it and its run path searches $ORIGIN first ...
    deps = triton._private_dependencies(Path(lib))
    for dep in deps:
        assert (d / dep.name).read_bytes() == dep.read_bytes()
    dynamic = subprocess.run(["readelf", "-d", str(copied)], capture_output=True, text=True).stdout
    runpath = [line for line in dynamic.splitlines() if "RUNPATH" in line or "RPATH" in line]
    assert runpath and "[$ORIGIN" in runpath[0], dynamic
    # ... so that a process that knows nothing of the build (as in a Triton container) registers it and runs
    # the repository's model: ONNX Runtime with the library's path as the config gives it.
    script = (
        "import sys, numpy as np, onnxruntime as ort\n"
        "so = ort.SessionOptions(); so.register_custom_ops_library(sys.argv[1])\n"
        "s = ort.InferenceSession(sys.argv[2], so, providers=['CPUExecutionProvider'])\n"
        "x = np.arange(2*4*16*16, dtype=np.float32).reshape(2, 4, 16, 16) / 100\n"
        "r = np.array([[1, 2, 2, 9, 12]], np.float32)\n"
        "np.save(sys.argv[3], s.run(None, {'input': x, 'rois': r})[0])\n"
    )
    out = tmp_path / "out.npy"
    res = subprocess.run([sys.executable, "-c", script, str(copied), str(d / "1" / "model.onnx"), str(out)],
                         env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    from dcnkit import reference

    x = np.arange(2 * 4 * 16 * 16, dtype=np.float32).reshape(2, 4, 16, 16) / 100
    want = reference.roi_align(x, np.array([[1, 2, 2, 9, 12]], np.float32), (2, 2), 1.0, 2, True)
    np.testing.assert_allclose(np.load(out), want, rtol=1e-5, atol=1e-5)


def test_writer_errors(tmp_path):
    with pytest.raises(ValueError, match="instance_kind: expected KIND_GPU or KIND_AUTO for a TensorRT engine"):
        triton.write_repository(_batch_model(), tmp_path, name="m", backend="tensorrt", instance_kind="KIND_CPU")
    with pytest.raises(ValueError, match="engine: expected only with backend='tensorrt'"):
        triton.write_repository(_batch_model(), tmp_path, name="m", engine="m.engine")
    with pytest.raises(ValueError, match="backend: expected one of onnxruntime, tensorrt, python, got 'tf'"):
        triton.write_repository(_batch_model(), tmp_path, name="m", backend="tf")
    with pytest.raises(ValueError, match="name: expected a model name"):
        triton.write_repository(_batch_model(), tmp_path)
    with pytest.raises(ValueError, match="name: expected a plain directory name, got 'a/b'"):
        triton.write_repository(_batch_model(), tmp_path, name="a/b")
    with pytest.raises(ValueError, match=r"preferred_batch_sizes: expected values in \[1, 4\], got \[8\]"):
        triton.write_repository(_batch_model(), tmp_path, name="m", max_batch_size=4, preferred_batch_sizes=[8])
    with pytest.raises(FileNotFoundError, match="model: expected an existing ONNX file"):
        triton.write_repository(tmp_path / "nope.onnx", tmp_path)
    triton.write_repository(_batch_model(), tmp_path, name="m")
    with pytest.raises(FileExistsError, match="exists"):
        triton.write_repository(_batch_model(), tmp_path, name="m")
    triton.write_repository(_batch_model(), tmp_path, name="m", overwrite=True, max_batch_size=2)
    assert _parse(tmp_path / "m").max_batch_size == 2


def test_parse_config_is_strict():
    from google.protobuf.text_format import ParseError

    ok = 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 2\ninput [ { name: "x" data_type: TYPE_FP32 ' \
         'dims: [ 3 ] } ]'
    assert triton.parse_config(ok).input[0].dims == [3]
    with pytest.raises(ParseError, match="max_batch_sise"):
        triton.parse_config('max_batch_sise: 2')
    with pytest.raises(ParseError, match="TYPE_FLOAT"):
        triton.parse_config('input [ { name: "x" data_type: TYPE_FLOAT dims: [ 3 ] } ]')
    with pytest.raises(ParseError):
        triton.parse_config('max_batch_size: "two"')


def test_check_repository_finds_problems(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    assert triton.check_repository(d) == [f"{d / 'config.pbtxt'}: missing"]
    (d / "config.pbtxt").write_text('name: "other"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 0\n'
                                    'input [ { name: "x" dims: [ 0 ] } ]\ndynamic_batching { }\n')
    problems = "\n".join(triton.check_repository(d))
    for want in ("name: expected the directory name 'm', got 'other'", "platform/backend: expected onnxruntime",
                 "no numeric version directory", "input 'x': data_type missing", "output: none declared",
                 "dims must be -1 or positive", "dynamic_batching: needs max_batch_size > 0"):
        assert want in problems


def test_pbtxt_round_trip_of_model_config():
    sig = triton.Signature.of(_batch_model())
    cfg = triton.model_config(sig, "m", max_batch_size=4, op_libraries=["/models/m/libdcnkit_ort.so"])
    msg = triton.parse_config(triton.to_pbtxt(cfg))
    assert msg.name == "m" and msg.max_batch_size == 4
    assert [i.name for i in msg.input] == ["x", "s"] and list(msg.output[0].dims) == [3, 8, 8]
    assert list(msg.model_operations.op_library_filename) == ["/models/m/libdcnkit_ort.so"]


def test_dtype_maps():
    assert triton.v2_datatype(np.float32) == "FP32" and triton.numpy_dtype("INT64") == np.int64
    assert triton.triton_data_type(np.bool_) == "TYPE_BOOL"
    with pytest.raises(ValueError, match="datatype: expected one of .* got 'FLOAT'"):
        triton.numpy_dtype("FLOAT")
    with pytest.raises(ValueError, match="dtype: expected one of .* got complex64"):
        triton.v2_datatype(np.complex64)


def test_cli_triton_repo(tmp_path, capsys):
    path = tmp_path / "net.onnx"
    onnx.save(_batch_model(), str(path))
    out = tmp_path / "repo"
    assert cli_main(["triton-repo", str(path), "-o", str(out), "--max-batch-size", "4",
                     "--preferred-batch-size", "2", "--instance-kind", "KIND_CPU"]) == 0
    printed = capsys.readouterr().out
    assert "wrote" in printed and "tritonserver --model-repository=/models" in printed
    cfg = _parse(out / "net")
    assert cfg.max_batch_size == 4 and list(cfg.dynamic_batching.preferred_batch_size) == [2]
    assert cfg.instance_group[0].kind == 2  # KIND_CPU
    assert cli_main(["triton-repo", str(path), "-o", str(out)]) == 2
    assert "exists (pass overwrite=True / --overwrite" in capsys.readouterr().err
    assert cli_main(["triton-repo", str(path), "-o", str(out), "--engine", str(path)]) == 2
    assert "--engine: expected only with --backend tensorrt" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["triton-repo", str(path), "-o", str(out), "--max-batch-size", "-1"])
    assert "expected an integer >= 0, got -1" in capsys.readouterr().err
