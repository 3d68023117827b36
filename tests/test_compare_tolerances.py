"""``dcnkit compare`` with per-output tolerances (``--atol boxes:0.05 --rtol scores:1e-3``, as Polygraphy):
parsing, the verdict per output, and errors naming the option."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from dcnkit import cli


def call(capsys, *args):
    rc = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def two_outputs(tmp_path_factory):
    """``y``: ONNX RoiAlign in max mode, where ONNX Runtime's built-in kernel (ONNX's max: the largest weighted corner
    value) differs from OpenVINO's ROIAlign (the largest interpolated sample: docs/openvino.md) by far more than 1e-3;
    ``z``: Relu(x), identical on both. So a tolerance for ``y`` alone decides the verdict."""
    from dcnkit.runtime.openvino import openvino_reason

    if openvino_reason() is not None:
        pytest.skip(f"openvino backend: {openvino_reason()}")
    nodes = [
        helper.make_node("RoiAlign", ["x", "rois", "batch_indices"], ["y"], output_height=3, output_width=3,
                         sampling_ratio=2, mode="max"),
        helper.make_node("Relu", ["x"], ["z"]),
    ]
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 8, 8]),
         helper.make_tensor_value_info("rois", T.FLOAT, [3, 4]),
         helper.make_tensor_value_info("batch_indices", T.INT64, [3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None), helper.make_tensor_value_info("z", T.FLOAT, None)],
    )
    path = tmp_path_factory.mktemp("models") / "two.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)], ir_version=10), str(path))
    return path


SHAPES = ["--backends", "ort-cpu,openvino", "--shape", "batch_indices:3:int64[0,1]", "--shape", "rois:3x4:float32[0,7]",
          "--shape", "x:1x2x8x8:float32[1,2]"]


def _max_abs(out: str, name: str) -> float:
    row = next(line for line in out.splitlines() if line.startswith(f"{name} "))
    return float(row.split()[3])


def test_parse_tolerances_forms():
    assert cli.parse_tolerances(None, "--atol", 1e-4) == {"": 1e-4}
    assert cli.parse_tolerances(["1e-3"], "--atol", 1e-4) == {"": 1e-3}
    assert cli.parse_tolerances(["boxes:0.05", "1e-5"], "--atol", 1e-4) == {"": 1e-5, "boxes": 0.05}
    assert cli.parse_tolerances(["boxes:0.05,scores:1e-3", "scores:2e-3"], "--rtol", 0) == {
        "": 0.0, "boxes": 0.05, "scores": 2e-3}
    # An output name with a colon: the value is after the last one.
    assert cli.parse_tolerances(["a:b:0.5"], "--atol", 0) == {"": 0.0, "a:b": 0.5}


@pytest.mark.parametrize("value,needle", [
    ("boxes:", "--atol: expected a number in 'boxes:'"),
    ("boxes:abc", "--atol: expected a number in 'boxes:abc'"),
    (":0.1", "--atol: expected an output name before ':' in ':0.1'"),
    ("boxes:-1", "--atol: expected a finite tolerance >= 0 in 'boxes:-1', got -1"),
    ("nan", "--atol: expected a finite tolerance >= 0 in 'nan'"),
    ("1e-3,,2", "--atol: expected VALUE or OUTPUT:VALUE"),
])
def test_parse_tolerances_errors(value, needle):
    with pytest.raises(cli.CliError) as e:
        cli.parse_tolerances([value], "--atol", 1e-4)
    assert needle in str(e.value)


def test_bare_tolerance_fails_on_the_differing_output(capsys, two_outputs):
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES, "--atol", "1e-4")
    assert rc == 1, out
    assert _max_abs(out, "y") > 1e-3 and _max_abs(out, "z") == 0.0
    assert "FAILED" in out


def test_per_output_atol_passes_only_for_the_named_output(capsys, two_outputs):
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES)
    assert rc == 1
    big = 10 * _max_abs(out, "y")
    # The tolerance on y admits its difference, z keeps the strict default.
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES, "--atol", f"y:{big:g}", "--rtol", "0")
    assert rc == 0, out
    assert f"y: atol={big:g}, rtol=0" in out and out.strip().endswith("PASSED")
    # The same value for z only does not help y.
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES, "--atol", f"z:{big:g}", "--rtol", "0")
    assert rc == 1 and "FAILED" in out
    # A bare value after a named one sets the default; the named one stays (comma list form).
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES, "--atol", f"y:{big:g},0", "--rtol", "0")
    assert rc == 0, out


def test_per_output_rtol(capsys, two_outputs):
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES, "--atol", "0", "--rtol", "0")
    assert rc == 1
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES)
    row = next(line for line in out.splitlines() if line.startswith("y "))
    max_rel = float(row.split()[5])
    assert max_rel > 1e-3
    rc, out, _ = call(capsys, "compare", two_outputs, *SHAPES, "--atol", "0", "--rtol", f"y:{10 * max_rel:g}",
                      "--rtol", "0")
    assert rc == 0, out


@pytest.mark.parametrize("opt", ["--atol", "--rtol"])
def test_unknown_output_name_is_an_error_naming_the_option(capsys, two_outputs, opt):
    rc, _, err = call(capsys, "compare", two_outputs, *SHAPES, opt, "boxes:0.05")
    assert rc == 2
    assert len(err.strip().splitlines()) == 1
    assert f"dcnkit compare: error: {opt}: expected output names among ['y', 'z'], got ['boxes']" in err


def test_bad_value_exits_2(capsys, two_outputs):
    rc, _, err = call(capsys, "compare", two_outputs, *SHAPES, "--rtol", "scores:x")
    assert rc == 2 and "--rtol: expected a number in 'scores:x'" in err


def test_compare_backends_takes_dicts(two_outputs):
    from dcnkit.polygraphy_ext import compare_backends

    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 2, 8, 8)).astype(np.float32),
              "rois": np.array([[0, 0, 5, 5], [1, 1, 7, 6], [2, 0, 6, 7]], np.float32),
              "batch_indices": np.zeros(3, np.int64)}]
    passed, stats, _ = compare_backends(two_outputs, ["ort-cpu", "openvino"], feeds, atol=1e-4, rtol=1e-4)
    assert not passed
    y = next(r for r in stats if r["output"] == "y")
    passed, _, _ = compare_backends(two_outputs, ["ort-cpu", "openvino"], feeds,
                                    atol={"": 0.0, "y": 10 * y["max_abs"]}, rtol=0.0)
    assert passed
