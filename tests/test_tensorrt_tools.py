"""The TensorRT tools without TensorRT: what can be checked on a machine with neither a GPU nor TensorRT.

- ``dcnkit.tensorrt_library()``, the backend's reason line, and that importing the tools imports neither
  tensorrt nor torch;
- ``--shapes`` parsing and its checks against the model, Polygraphy profiles built from it;
- the float16 / bfloat16 conversion for strongly typed networks (our nodes kept, one float type inside,
  ``onnx.checker`` and strict shape inference pass, values match the NumPy reference within float16 accuracy);
- every TensorRT entry point of the CLI: one line naming what is missing, exit code 1; argument errors exit 2
  before TensorRT is needed;
- ``triton-repo --backend tensorrt --engine`` against Triton's config schema (the engine's content is not
  validated: a dummy file stands in for it);
- docs/tensorrt.md holds the output of scripts/gen_tensorrt_fields.py.

Building and running engines is not tested here (no TensorRT): see docs/tensorrt.md, "What has been verified".
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import dcnkit
from dcnkit.runtime import precision, runners
from dcnkit.runtime import tensorrt as dk_trt
from dcnkit.runtime import triton

ROOT = Path(__file__).resolve().parents[1]
TRT_REASON = runners.available_backends()["tensorrt"]
no_tensorrt = pytest.mark.skipif(TRT_REASON is None, reason="TensorRT can run here: the 'missing' paths do not apply")


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dcnkit", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


def _call(capsys, *args):
    """``dcnkit ARGS`` in this process (argparse's exit included): (exit code, stderr)."""
    from dcnkit.cli import main

    capsys.readouterr()
    try:
        rc = main([str(a) for a in args])
    except SystemExit as e:
        rc = e.code
    return rc, capsys.readouterr().err


def _relu_model(path=None, dim0="N"):
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", T.FLOAT, [dim0, 3, 4, 4])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [dim0, 3, 4, 4])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10)
    if path is not None:
        onnx.save(m, str(path))
    return m


def _dcn_model(big_weight=False):
    """DeformConv2d -> Relu -> Resize(x2) -> RoIAlign; ``feat`` is a graph output that later nodes consume too."""
    from dcnkit.export.schemas import register_onnx_schemas

    register_onnx_schemas()
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((6, 4, 3, 3)) * 0.3).astype(np.float32)
    if big_weight:
        w[0, 0, 0, 0] = 1e6  # beyond float16's range: clipped
    b = rng.standard_normal(6).astype(np.float32)
    nodes = [
        helper.make_node("DeformConv2d", ["x", "offset", "w", "b", "mask"], ["feat"], domain="dcnkit", name="dcn",
                         padding=[1, 1]),
        helper.make_node("Relu", ["feat"], ["act"], name="relu"),
        helper.make_node("Resize", ["act", "", "scales"], ["up"], name="resize", mode="nearest"),
        helper.make_node("RoIAlign", ["up", "rois"], ["pooled"], domain="dcnkit", name="roi", output_size=[2, 2],
                         spatial_scale=2.0, sampling_ratio=2, aligned=1),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", 4, "H", "W"]),
         helper.make_tensor_value_info("offset", T.FLOAT, ["N", 18, "H", "W"]),
         helper.make_tensor_value_info("mask", T.FLOAT, ["N", 9, "H", "W"]),
         helper.make_tensor_value_info("rois", T.FLOAT, ["K", 5])],
        [helper.make_tensor_value_info("feat", T.FLOAT, ["N", 6, "H", "W"]),
         helper.make_tensor_value_info("pooled", T.FLOAT, ["K", 6, 2, 2])],
        initializer=[numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"),
                     numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                             ir_version=10)


def _feeds(rng):
    return {
        "x": rng.standard_normal((2, 4, 7, 8)).astype(np.float32),
        "offset": rng.standard_normal((2, 18, 7, 8)).astype(np.float32),
        "mask": rng.uniform(0, 1, (2, 9, 7, 8)).astype(np.float32),
        "rois": np.array([[0, 1, 1, 10, 12], [1, 0, 2, 14, 12], [1, 3, 3, 4, 5]], np.float32),
    }


# ------------------------------------------------------------------------------------------------
# Library, availability, imports
# ------------------------------------------------------------------------------------------------
def test_tensorrt_library_path_or_how_to_build_it():
    try:
        path = Path(dcnkit.tensorrt_library())
    except FileNotFoundError as e:
        msg = str(e)
        assert "libdcnkit_trt.so" in msg and "TensorRT_ROOT" in msg and "TensorRT_INCLUDE_DIR" in msg
        assert "libdcnkit_trt.so is not built" in TRT_REASON
    else:
        assert path.name == "libdcnkit_trt.so" and path.is_file() and path.is_absolute()


@no_tensorrt
def test_reason_is_one_line_naming_what_is_missing_and_how_to_get_it():
    assert "\n" not in TRT_REASON
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert "tensorrt Python module is not installed" in TRT_REASON and "pip install tensorrt" in TRT_REASON
    with pytest.raises(runners.BackendUnavailable, match="^tensorrt: "):
        runners.make_runner(_relu_model(), "tensorrt")
    with pytest.raises(runners.BackendUnavailable, match="^tensorrt: "):
        dk_trt.require_tensorrt()


def test_importing_the_tools_imports_neither_tensorrt_nor_torch():
    code = ("import sys, dcnkit; before = set(sys.modules); "
            "import dcnkit.runtime, dcnkit.runtime.tensorrt, dcnkit.runtime.precision, dcnkit.runtime.triton_tensorrt, "
            "dcnkit.cli_build; new = set(sys.modules) - before; "
            "print(sorted(m for m in new if m.split('.')[0] in ('tensorrt', 'torch', 'pycuda')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ------------------------------------------------------------------------------------------------
# Shapes and profiles
# ------------------------------------------------------------------------------------------------
def test_parse_shapes():
    got = dk_trt.parse_shapes(["x:1x3x64x64:4x3x64x64:8x3x64x64", "in:0:rois:0x5:100x5:300x5"])
    assert got == {"x": ((1, 3, 64, 64), (4, 3, 64, 64), (8, 3, 64, 64)),
                   "in:0:rois": ((0, 5), (100, 5), (300, 5))}  # names may contain ':'
    for bad, needle in [
        ("x:1x3", "expected NAME:MIN:OPT:MAX"),
        (":1:2:3", "expected NAME:MIN:OPT:MAX"),
        ("x:1xa:2x3:3x3", "shapes like 1x3x64x64, got 'x:1xa:2x3:3x3'"),
        ("x:1x3:2x3x4:3x3", "x: expected MIN, OPT and MAX of one rank"),
        ("x:4x3:2x3:8x3", "x: expected MIN <= OPT <= MAX in every dim, got (4, 3), (2, 3), (8, 3)"),
        ("x:-1x3:2x3:8x3", "expected non-negative dims"),
    ]:
        with pytest.raises(dk_trt.ShapeSpecError) as e:
            dk_trt.parse_shapes([bad])
        assert str(e.value).startswith("--shapes: ") and needle in str(e.value), str(e.value)
    with pytest.raises(dk_trt.ShapeSpecError, match="expected each input once, got 'x' twice"):
        dk_trt.parse_shapes(["x:1:1:1", "x:2:2:2"])


def test_check_shapes_against_the_model():
    m = _dcn_model()
    full = {"x": ((1, 4, 8, 8), (2, 4, 16, 16), (4, 4, 32, 32)), "offset": ((1, 18, 8, 8),) * 3,
            "mask": ((1, 9, 8, 8),) * 3, "rois": ((1, 5), (10, 5), (100, 5))}
    assert dk_trt.check_shapes(m, full) == full
    cases = [
        ({**full, "y": ((1,),) * 3}, "expected input names among ['x', 'offset', 'mask', 'rois'], got ['y']"),
        ({k: v for k, v in full.items() if k != "rois"}, "input 'rois' has dynamic dims ('K', 5)"),
        ({**full, "rois": ((1, 4), (1, 4), (1, 4))}, "rois: expected MIN to match the fixed dims of ('K', 5)"),
        ({**full, "x": ((1, 4, 8),) * 3}, "x: expected rank 4"),
    ]
    for shapes, needle in cases:
        with pytest.raises(dk_trt.ShapeSpecError) as e:
            dk_trt.check_shapes(m, shapes)
        assert needle in str(e.value), str(e.value)


def test_profile_from_shapes():
    from polygraphy.backend.trt import Profile

    shapes = dk_trt.parse_shapes(["x:1x3x8x8:2x3x8x8:4x3x8x8", "rois:0x5:10x5:20x5"])
    prof = dk_trt.make_profile(shapes)
    assert isinstance(prof, Profile) and list(prof) == ["x", "rois"]
    assert (tuple(prof["x"].min), tuple(prof["x"].opt), tuple(prof["x"].max)) == ((1, 3, 8, 8), (2, 3, 8, 8),
                                                                                  (4, 3, 8, 8))
    assert tuple(prof["rois"].min) == (0, 5) and tuple(prof["rois"].max) == (20, 5)


# ------------------------------------------------------------------------------------------------
# Reduced precision for strongly typed networks
# ------------------------------------------------------------------------------------------------
def _types(model) -> dict:
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, check_type=True)
    g = inferred.graph
    out = {v.name: v.type.tensor_type.elem_type for v in list(g.input) + list(g.value_info) + list(g.output)}
    out.update({t.name: t.data_type for t in g.initializer})
    return out


@pytest.mark.parametrize("dtype,elem", [("float16", T.FLOAT16), ("bfloat16", T.BFLOAT16)])
def test_conversion_keeps_our_nodes_in_one_float_type(dtype, elem):
    model = _dcn_model()
    conv, report = precision.convert_float_tensors(model, dtype)
    onnx.checker.check_model(conv, full_check=True)
    types = _types(conv)
    ours = [n for n in conv.graph.node if n.domain == "dcnkit"]
    assert [(n.op_type, n.name) for n in ours] == [("DeformConv2d", "dcn"), ("RoIAlign", "roi")]
    orig = {n.name: n for n in model.graph.node}
    for n in ours:  # attributes untouched, every input and output in the target type but the RoIs (float32)
        assert list(n.attribute) == list(orig[n.name].attribute)
        assert {types[t] for t in list(n.input) + list(n.output) if t and t != "rois"} == {elem}, n.name
    assert types["rois"] == T.FLOAT and "RoIAlign roi: input 1" in report.kept_float32
    assert types["w"] == elem and types["b"] == elem
    assert types["scales"] == T.FLOAT  # Resize's scales must be float32 (its schema): kept, not converted
    assert "Resize resize: input 2" in report.kept_float32
    for v in list(conv.graph.input) + list(conv.graph.output):  # I/O stays float32
        assert v.type.tensor_type.elem_type == T.FLOAT
    # `feat` is a graph output AND feeds Relu: Relu must read the converted tensor, not the float32 output.
    relu = next(n for n in conv.graph.node if n.name == "relu")
    assert types[relu.input[0]] == elem and relu.input[0] != "feat"
    assert report.initializers == 2 and report.casts == 5  # 3 input casts (not the RoIs) + 2 output casts


def test_float16_conversion_computes_the_same_model():
    from dcnkit.runtime.reference_runner import ReferenceRunner

    model = _dcn_model()
    conv, _ = precision.convert_float_tensors(model, "float16")
    feeds = _feeds(np.random.default_rng(1))
    with ReferenceRunner(model) as r:
        want = r.run(feeds)
    with ReferenceRunner(conv) as r:
        got = r.run(feeds)
    for name in ("feat", "pooled"):
        assert got[name].dtype == np.float32 and got[name].shape == want[name].shape
        np.testing.assert_allclose(got[name], want[name], rtol=1e-2, atol=2e-2)
    # ...and it did run in float16 (a float32 graph would agree to ~1e-6)
    assert max(np.abs(got[n] - want[n]).max() for n in ("feat", "pooled")) > 1e-4


def test_conversion_of_initializers_listed_as_graph_inputs():
    model = _dcn_model()
    model.graph.input.append(helper.make_tensor_value_info("w", T.FLOAT, [6, 4, 3, 3]))  # IR < 4 style
    conv, _ = precision.convert_float_tensors(model, "float16")
    onnx.checker.check_model(conv, full_check=True)
    assert _types(conv)["w"] == T.FLOAT16
    assert next(v for v in conv.graph.input if v.name == "w").type.tensor_type.elem_type == T.FLOAT16


def test_conversion_of_constants():
    """Constant(value_float), ConstantOfShape without value (float32 zeros): both become float16."""
    from onnx.reference import ReferenceEvaluator

    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("ConstantOfShape", ["s"], ["z"]),
             helper.make_node("Constant", [], ["c"], value_float=2.5),
             helper.make_node("Add", ["x", "z"], ["a"]), helper.make_node("Mul", ["a", "c"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", T.FLOAT, [2, 3])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    conv, report = precision.convert_float_tensors(m, "float16")
    onnx.checker.check_model(conv, full_check=True)
    types = _types(conv)
    assert types["z"] == T.FLOAT16 and types["c"] == T.FLOAT16 and report.constants == 2
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2.25
    y = ReferenceEvaluator(conv).run(None, {"x": x})[0]
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, (x.astype(np.float16) * np.float16(2.5)).astype(np.float32))


def test_conversion_clips_to_the_float16_range_and_rejects_other_types():
    conv, report = precision.convert_float_tensors(_dcn_model(big_weight=True), "float16")
    w = numpy_helper.to_array(next(t for t in conv.graph.initializer if t.name == "w"))
    assert w.dtype == np.float16 and w[0, 0, 0, 0] == np.finfo(np.float16).max and report.clipped == 1
    assert "1 values clipped" in report.summary()
    with pytest.raises(ValueError, match="dtype: expected one of float16, bfloat16, got 'int8'"):
        precision.convert_float_tensors(_dcn_model(), "int8")


def test_plugin_namespace_is_added_to_dcnkit_nodes_only():
    m = _dcn_model()
    roi = next(n for n in m.graph.node if n.name == "roi")
    roi.attribute.append(helper.make_attribute("plugin_namespace", "custom"))
    assert dk_trt.add_plugin_namespace(m) == 1
    ns = {n.name: [a.s.decode() for a in n.attribute if a.name == "plugin_namespace"] for n in m.graph.node}
    assert ns == {"dcn": ["dcnkit"], "relu": [], "resize": [], "roi": ["custom"]}
    assert dk_trt.add_plugin_namespace(m) == 0


# ------------------------------------------------------------------------------------------------
# The CLI without TensorRT: one line, exit 1; argument errors: exit 2
# ------------------------------------------------------------------------------------------------
@no_tensorrt
@pytest.mark.parametrize("argv", [
    ["build", "{m}", "-o", "{tmp}/m.engine", "--shapes", "x:1x3x4x4:1x3x4x4:1x3x4x4"],
    ["build", "{m}", "-o", "{tmp}/m.engine", "--fp16", "--shapes", "x:1x3x4x4:2x3x4x4:4x3x4x4"],
    ["run", "{m}", "--backend", "tensorrt", "--batch", "2"],
    ["run", "{tmp}/given.engine", "--backend", "tensorrt"],
    ["bench", "{m}", "--backends", "tensorrt", "--iterations", "2"],
    ["bench", "{tmp}/given.engine"],
    ["compare", "{m}", "--backends", "tensorrt,reference", "--batch", "2"],
    ["serve", "{m}", "--backend", "tensorrt", "--port", "0"],
    ["triton-repo", "{m}", "-o", "{tmp}/repo", "--backend", "tensorrt"],
])
def test_without_tensorrt_one_line_exit_1(argv, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    _relu_model(model)
    (tmp_path / "given.engine").write_bytes(b"not an engine")
    argv = [a.format(m=model, tmp=tmp_path) for a in argv]
    if argv[0] == "build":  # as users run it: a process of its own
        p = _cli(*argv)
        rc, err = p.returncode, p.stderr
    else:
        rc, err = _call(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 1, err
    assert len(lines) == 1, err
    assert "tensorrt: " in lines[0] and "Traceback" not in err
    if "tensorrt Python module is not installed" in TRT_REASON:
        assert "pip install tensorrt" in lines[0] and "NVIDIA GPU" in lines[0]
    if "libdcnkit_trt.so is not built" in TRT_REASON:
        assert "TensorRT_ROOT" in lines[0] and "TensorRT_INCLUDE_DIR" in lines[0]
    assert not (tmp_path / "m.engine").exists() and not (tmp_path / "repo").exists()


@pytest.mark.parametrize("argv,needle", [
    (["build", "{m}"], "the following arguments are required: -o/--output"),
    (["build", "{m}", "-o", "{tmp}/e", "--fp16", "--bf16"], "argument --bf16: not allowed with argument --fp16"),
    (["build", "{m}", "-o", "{tmp}/e", "--workspace", "0"], "--workspace: expected an integer >= 1, got 0"),
    (["build", "{tmp}/nope.onnx", "-o", "{tmp}/e"], "model: expected an existing ONNX file"),
    (["build", "{tmp}/given.engine", "-o", "{tmp}/e"], "model: expected an ONNX file, got the engine"),
    (["build", "{m}", "-o", "{tmp}/e"], "--shapes: input 'x' has dynamic dims ('N', 3, 4, 4): give --shapes x:"),
    (["build", "{m}", "-o", "{tmp}/e", "--shapes", "x:1x3x4x4"], "--shapes: expected NAME:MIN:OPT:MAX"),
    (["build", "{m}", "-o", "{tmp}/e", "--shapes", "x:1x3x4x4:2x3x4x4:4x3x4x5"],
     "--shapes: x: expected MAX to match the fixed dims"),
    (["build", "{m}", "-o", "{tmp}/e", "--shapes", "x:1x3x4x4:1x3x4x4:1x3x4x4", "--plugins", "{tmp}/no.so"],
     "--plugins: expected an existing plugin library"),
    (["run", "{tmp}/given.engine"], "--backend: expected tensorrt for the engine file"),
    (["compare", "{tmp}/given.engine", "--backends", "tensorrt,reference"], "model: expected the ONNX file"),
    (["triton-repo", "{m}", "-o", "{tmp}/r", "--backend", "tensorrt", "--engine", "{tmp}/e",
      "--shapes", "x:1"], "--shapes: expected NAME:MIN:OPT:MAX"),
])
def test_argument_errors_exit_2_before_tensorrt_is_needed(argv, needle, tmp_path, capsys):
    model = tmp_path / "m.onnx"
    _relu_model(model)
    (tmp_path / "given.engine").write_bytes(b"not an engine")
    argv = [a.format(m=model, tmp=tmp_path) for a in argv]
    if argv[:2] == ["build", str(model)] and len(argv) == 2:  # one of them as its own process
        p = _cli(*argv)
        rc, err = p.returncode, p.stderr
    else:
        rc, err = _call(capsys, *argv)
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err


# ------------------------------------------------------------------------------------------------
# Triton: a tensorrt_plan model
# ------------------------------------------------------------------------------------------------
def test_triton_tensorrt_repository_from_a_given_engine(tmp_path, capsys):
    from dcnkit.server.cli import main as server_main

    model = tmp_path / "net.onnx"
    _relu_model(model, dim0="batch")
    engine = tmp_path / "net.engine"
    engine.write_bytes(b"\x00serialized engine stand-in\x01")  # content not validated
    assert server_main(["triton-repo", str(model), "-o", str(tmp_path / "repo"), "--backend", "tensorrt",
                        "--engine", str(engine), "--max-batch-size", "4", "--instance-kind", "KIND_GPU"]) == 0
    printed = capsys.readouterr().out
    d = tmp_path / "repo" / "net"
    assert "wrote" in printed and "--gpus=all" in printed
    cfg = triton.parse_config((d / "config.pbtxt").read_text())  # Triton's field names and types
    assert cfg.platform == "tensorrt_plan" and cfg.name == "net" and cfg.max_batch_size == 4
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.input] == [("x", 11, [3, 4, 4])]
    assert [(t.name, t.data_type, list(t.dims)) for t in cfg.output] == [("y", 11, [3, 4, 4])]
    assert cfg.instance_group[0].kind == 1 and cfg.HasField("dynamic_batching")
    assert (d / "1" / "model.plan").read_bytes() == engine.read_bytes()
    assert not (d / "libdcnkit_trt.so").exists()  # no custom nodes: no plugins needed
    assert triton.check_repository(d) == []
    (d / "1" / "model.plan").unlink()
    assert triton.check_repository(d) == [f"{d / '1'}: missing model.plan"]


def _custom_roi_model(path):
    g = helper.make_graph(
        [helper.make_node("RoIAlign", ["input", "rois"], ["output"], domain="dcnkit", output_size=[2, 2])], "roi",
        [helper.make_tensor_value_info("input", T.FLOAT, ["N", 4, 16, 16]),
         helper.make_tensor_value_info("rois", T.FLOAT, ["K", 5])],
        [helper.make_tensor_value_info("output", T.FLOAT, ["K", 4, 2, 2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dcnkit", 1)],
                                ir_version=9), str(path))


def test_triton_tensorrt_repository_with_plugins(tmp_path, capsys):
    from dcnkit.server.cli import main as server_main

    model = tmp_path / "roi.onnx"
    _custom_roi_model(model)
    engine = tmp_path / "roi.plan"
    engine.write_bytes(b"stand-in")
    # The plugin library already in the image: referenced verbatim, nothing copied.
    assert server_main(["triton-repo", str(model), "-o", str(tmp_path / "a"), "--backend", "tensorrt",
                        "--engine", str(engine), "--library-path", "/opt/dcnkit/libdcnkit_trt.so"]) == 0
    assert "--backend-config=tensorrt,plugins=/opt/dcnkit/libdcnkit_trt.so" in capsys.readouterr().out
    text = (tmp_path / "a" / "roi" / "config.pbtxt").read_text()
    assert '--backend-config=tensorrt,plugins="/opt/dcnkit/libdcnkit_trt.so"' in text
    cfg = triton.parse_config(text)
    assert cfg.max_batch_size == 0 and not cfg.HasField("dynamic_batching")  # RoI model: no shared batch dim
    assert triton.check_repository(tmp_path / "a" / "roi") == []
    assert not (tmp_path / "a" / "roi" / "libdcnkit_trt.so").exists()
    # The kit's library copied beside the config, when it is built; else the error says how to build it.
    rc = server_main(["triton-repo", str(model), "-o", str(tmp_path / "b"), "--backend", "tensorrt",
                      "--engine", str(engine)])
    err = capsys.readouterr().err
    try:
        lib = Path(dcnkit.tensorrt_library())
    except FileNotFoundError:
        assert rc == 2 and "libdcnkit_trt.so" in err and "TensorRT_ROOT" in err
        assert not (tmp_path / "b" / "roi").exists()
    else:
        copied = tmp_path / "b" / "roi" / "libdcnkit_trt.so"
        assert rc == 0 and copied.read_bytes() == lib.read_bytes()
        # Triton's backend only dlopens plugins=: it names the autoreg library, copied beside the plugins.
        autoreg = copied.with_name("libdcnkit_trt_autoreg.so")
        assert autoreg.read_bytes() == lib.with_name("libdcnkit_trt_autoreg.so").read_bytes()
        assert '--backend-config=tensorrt,plugins="/models/roi/libdcnkit_trt_autoreg.so"' in copied.with_name(
            "config.pbtxt").read_text()


def test_triton_tensorrt_rejects_cpu_instances(tmp_path):
    model = tmp_path / "net.onnx"
    _relu_model(model, dim0="batch")
    engine = tmp_path / "net.engine"
    engine.write_bytes(b"x")
    d = triton.write_repository(model, tmp_path / "r", backend="tensorrt", engine=engine)
    text = (d / "config.pbtxt").read_text() + 'instance_group [ { kind: KIND_CPU } ]\n'
    (d / "config.pbtxt").write_text(text)
    assert "instance_group: TensorRT engines run on GPUs, got KIND_CPU" in triton.check_repository(d)
    with pytest.raises(FileNotFoundError, match="engine: expected an existing, non-empty engine file"):
        triton.write_repository(model, tmp_path / "r2", backend="tensorrt", engine=tmp_path / "none.engine")


# ------------------------------------------------------------------------------------------------
# Docs
# ------------------------------------------------------------------------------------------------
def test_docs_field_table_is_generated_from_op_defs():
    script = ROOT / "scripts" / "gen_tensorrt_fields.py"
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    doc = (ROOT / "docs" / "tensorrt.md").read_text()
    assert p.stdout.strip() in doc, "docs/tensorrt.md is out of date: python scripts/gen_tensorrt_fields.py --update docs/tensorrt.md"
    no_plugin: set[str] = set()  # not served by the plugin library yet (trt_creators.cpp)
    for op in dcnkit.op_defs()["ops"]:  # every op type and attribute of op_defs is in the table
        if op["onnx_type"] in no_plugin:
            assert f"`{op['onnx_type']}`" not in p.stdout
            continue
        assert f"`{op['onnx_type']}`" in p.stdout
        for a in op["attrs"]:
            assert f"`{a['name']}` ({a['kind']} -> " in p.stdout
