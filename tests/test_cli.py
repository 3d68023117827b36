"""The dcnkit command line, end to end: export, run, compare, bench, backends, serve/triton-repo registration,
argument errors (one line naming the argument, exit code 2)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from dcnkit import cli
from dcnkit import reference as ref

ROOT = Path(__file__).resolve().parents[1]

FACTORY = textwrap.dedent(
    """
    import torch
    import torch.nn as nn
    import dcnkit


    class DcnNet(nn.Module):
        def __init__(self, channels=4):
            super().__init__()
            self.offset = nn.Conv2d(3, 27, 3, padding=1)   # 18 offsets + 9 mask logits
            self.weight = nn.Parameter(torch.randn(channels, 3, 3, 3) * 0.2)
            self.bias = nn.Parameter(torch.randn(channels) * 0.1)

        def forward(self, x):
            om = self.offset(x)
            return dcnkit.ops.deform_conv2d(x, om[:, :18], self.weight, self.bias, padding=(1, 1),
                                            mask=torch.sigmoid(om[:, 18:]))


    class RoiNet(nn.Module):
        def forward(self, x, rois):
            return dcnkit.ops.roi_align(x, rois, (2, 2), spatial_scale=1.0, sampling_ratio=2, aligned=True)


    def build(channels=4):
        torch.manual_seed(0)
        return DcnNet(channels)


    def build_roi():
        return RoiNet()


    NOT_CALLABLE = 3
    """
)


def run_cli(*args, check=None, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env.update(env_extra or {})
    p = subprocess.run([sys.executable, "-m", "dcnkit", *map(str, args)], capture_output=True, text=True, env=env,
                       timeout=300)
    if check is not None:
        assert p.returncode == check, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


def call(capsys, *args):
    rc = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture(scope="module")
def factory_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("factory") / "models.py"
    p.write_text(FACTORY)
    return p


@pytest.fixture(scope="module")
def dc_model(tmp_path_factory):
    """Standard DeformConv (opset 19) built with onnx.helper; returns (path, weight, bias)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["y"], pads=[1, 1, 1, 1],
                            kernel_shape=[3, 3])
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 6, 6]),
         helper.make_tensor_value_info("offset", T.FLOAT, ["batch", 18, 6, 6]),
         helper.make_tensor_value_info("mask", T.FLOAT, ["batch", 9, 6, 6])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
        initializer=[helper.make_tensor("w", T.FLOAT, w.shape, w.ravel()), helper.make_tensor("b", T.FLOAT, b.shape, b)],
    )
    path = tmp_path_factory.mktemp("models") / "dc.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)], ir_version=10), str(path))
    return path, w, b


@pytest.fixture(scope="module")
def roi_max_model(tmp_path_factory):
    """ONNX RoiAlign in max mode: ONNX Runtime's built-in kernel (ONNX's max: the largest weighted corner term) is
    known to differ from OpenVINO's ROIAlign (the largest interpolated sample, docs/openvino.md), so ort-cpu vs
    openvino must report a mismatch."""
    from dcnkit.runtime.openvino import openvino_reason

    if openvino_reason() is not None:
        pytest.skip(f"openvino backend: {openvino_reason()}")
    node = helper.make_node("RoiAlign", ["x", "rois", "batch_indices"], ["y"], output_height=3, output_width=3,
                            sampling_ratio=2, mode="max")
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, [1, 2, 8, 8]),
         helper.make_tensor_value_info("rois", T.FLOAT, [3, 4]),
         helper.make_tensor_value_info("batch_indices", T.INT64, [3])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
    )
    path = tmp_path_factory.mktemp("models") / "roimax.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)], ir_version=10), str(path))
    return path


# ------------------------------------------------------------------------------------------------
# help, backends, parsing
# ------------------------------------------------------------------------------------------------
def test_help_of_every_command_via_python_m():
    p = run_cli("--help", check=0)
    for cmd in ("export", "run", "compare", "bench", "backends", "demo", "serve", "triton-repo"):
        assert cmd in p.stdout


@pytest.mark.parametrize("cmd", ["export", "run", "compare", "bench", "backends", "demo", "serve", "triton-repo"])
def test_help_per_command(cmd, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([cmd, "--help"])
    assert e.value.code == 0
    assert "usage: dcnkit " + cmd in capsys.readouterr().out


def test_backends_lists_each_backend_then_the_native_libraries(capsys, tmp_path, monkeypatch):
    # An installation whose library folder holds two of the five libraries.
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    for name in ("libdcnkit_ort.so", "libdcnkit_trt.so"):
        (lib_dir / name).write_bytes(b"")
    monkeypatch.setattr("dcnkit._lib._candidate_dirs", lambda: [lib_dir])
    monkeypatch.setattr("dcnkit._tensorrt_version", lambda: None)  # the line without the installed release
    rc, out, _ = call(capsys, "backends")
    assert rc == 0
    backends_part, libs_part = out.strip().split("\n\n")
    assert libs_part.splitlines() == [
        "native libraries:",
        f"  {'libdcnkit_torch.so':<26} not in this build",
        f"  {'libdcnkit_ort.so':<26} {lib_dir / 'libdcnkit_ort.so'}",
        f"  {'libdcnkit_ort_cuda.so':<26} not in this build",
        f"  {'libdcnkit_trt.so':<26} {lib_dir / 'libdcnkit_trt.so'}",
        # no dcnkit_trt.json beside it (a library built before the manifest): the 11.x headers' alone
        f"  {'':<26} serves TensorRT 11.x",
        f"  {'libdcnkit_trt_autoreg.so':<26} not in this build",
        f"  {'libdcnkit_ov.so':<26} not in this build"]
    monkeypatch.undo()
    rc, out, _ = call(capsys, "backends")
    lines = out.strip().split("\n\n")[0].splitlines()
    assert [l.split()[0] for l in lines] == ["ort-cpu", "ort-cuda", "tensorrt", "reference", "openvino"]
    assert lines[0].split()[1] == "available" and lines[3].split()[1] == "available"
    from dcnkit.runtime.runners import available_backends

    for line, (name, reason) in zip(lines, available_backends().items()):
        assert (reason is None) == (line.split()[1] == "available")
        if reason:
            assert reason in line


def test_parse_input_spec():
    s = cli.parse_input_spec("x:1x3x64x64")
    assert (s.name, s.shape, s.dtype, s.rois) == ("x", (1, 3, 64, 64), None, None)  # None: the model's dtype
    s = cli.parse_input_spec("idx:8:int64[0,4]")
    assert s.shape == (8,) and s.dtype == np.int64 and (s.low, s.high) == (0, 4)
    s = cli.parse_input_spec("rois:rois:8")
    assert s.rois == 8 and s.shape == (8, 5)
    for bad, needle in [("x", "NAME:SHAPE"), ("x:1xax3", "expected a shape like 1x3x64x64, got '1xax3'"),
                        ("x:1x3:int7", "expected a dtype"), ("r:rois:k", "expected an integer K"),
                        ("x:2:float32[3,1]", "LOW < HIGH")]:
        with pytest.raises(cli.CliError) as e:
            cli.parse_input_spec(bad)
        assert str(e.value).startswith("--input: ") and needle in str(e.value)


def test_random_rois_are_valid():
    rng = np.random.default_rng(0)
    r = cli.random_rois(rng, 50, batch=3, height=10, width=20)
    assert r.shape == (50, 5) and r.dtype == np.float32
    assert set(np.unique(r[:, 0])) <= {0.0, 1.0, 2.0}
    assert (r[:, 1] <= r[:, 3]).all() and (r[:, 2] <= r[:, 4]).all()
    assert r[:, 1:].min() >= 0 and r[:, [1, 3]].max() <= 19 and r[:, [2, 4]].max() <= 9


# ------------------------------------------------------------------------------------------------
# errors: one line naming the argument, exit code 2
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv,needle",
    [
        (["run", "missing.onnx"], "model: expected an existing ONNX file, got 'missing.onnx'"),
        (["run", "{dc}", "--backend", "cuda"], "--backend: expected one of ort-cpu, ort-cuda, tensorrt, reference, openvino, got 'cuda'"),
        (["run", "{dc}", "--shape", "x:2xfoo"], "--shape: expected a shape like 1x3x64x64, got '2xfoo'"),
        (["run", "{dc}", "--shape", "nope:1x3x6x6", "--batch", "1"], "--shape: expected input names among"),
        (["run", "{dc}", "--inputs", "missing.npz"], "--inputs: expected an existing .npz file"),
        (["compare", "{dc}", "--backends", "ort-cpu,gpu"], "--backends: expected backends among"),
        (["bench", "{dc}", "--iterations", "0"], "--iterations: expected >= 1, got 0"),
        (["export", "nomodule_xyz:build", "-o", "{tmp}/m.onnx", "--input", "x:1x3x8x8"],
         "factory: expected an importable module, got 'nomodule_xyz'"),
        (["export", "{factory}:NOT_CALLABLE", "-o", "{tmp}/m.onnx", "--input", "x:1x3x8x8"],
         "factory: expected a callable 'NOT_CALLABLE'"),
        (["export", "{factory}:build", "-o", "{tmp}/m.onnx", "--input", "x:1x3x8"],
         None),  # wrong rank reaches the model
        (["export", "{factory}:build", "-o", "{tmp}/m.onnx", "--input", "x:1x3x8x8", "--checkpoint", "{tmp}/no.pt"],
         "--checkpoint: expected an existing file"),
    ],
)
def test_errors_are_one_line_naming_the_argument(argv, needle, capsys, dc_model, factory_file, tmp_path):
    fmt = dict(dc=dc_model[0], factory=factory_file, tmp=tmp_path)
    argv = [a.format(**fmt) for a in argv]
    if needle is None:  # fails inside the model: one line, exit code 1
        rc, _, err = call(capsys, *argv)
        assert rc == 1 and len(err.strip().splitlines()) == 1 and err.startswith("dcnkit export: error: "), err
        return
    rc, out, err = call(capsys, *argv)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err, err
    assert err.startswith(f"dcnkit {argv[0]}: error: ")


def test_argparse_errors_are_one_line_exit_2():
    p = run_cli("run", check=2)
    assert len(p.stderr.strip().splitlines()) == 1 and "model" in p.stderr
    p = run_cli("bench", "x.onnx", "--iterations", "many", check=2)
    assert len(p.stderr.strip().splitlines()) == 1 and "--iterations" in p.stderr


def test_symbolic_dims_need_shape(capsys, tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", T.FLOAT, None)])
    path = tmp_path / "relu.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    rc, _, err = call(capsys, "run", path)
    assert rc == 2 and "--shape: input 'x' has symbolic dims ('batch', 3, 'H', 'W'): give --shape x:" in err
    rc, out, _ = call(capsys, "run", path, "--shape", "x:2x3x4x5")
    assert rc == 0 and "output y: float32 (2, 3, 4, 5)" in out
    rc, _, err = call(capsys, "run", path, "--shape", "x:2x4x4x5")
    assert rc == 2 and "--shape: x: expected shape ('batch', 3, 'H', 'W'), got (2, 4, 4, 5)" in err
    rc, _, err = call(capsys, "compare", path, "--backends", "reference,reference")
    assert rc == 2 and "--backends: expected each backend once" in err


# ------------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------------
def test_run_random_inputs_saves_outputs_equal_to_numpy_reference(tmp_path, dc_model, capsys):
    path, w, b = dc_model
    out, inp = tmp_path / "o.npz", tmp_path / "i.npz"
    rc, stdout, _ = call(capsys, "run", path, "--batch", 2, "--seed", 3, "-o", out, "--save-inputs", inp)
    assert rc == 0 and "output y: float32 (2, 5, 6, 6)" in stdout
    feeds, outs = np.load(inp), np.load(out)
    want = ref.deform_conv2d(feeds["x"], feeds["offset"], w, b, padding=(1, 1), mask=feeds["mask"])
    np.testing.assert_allclose(outs["y"], want, rtol=1e-4, atol=1e-4)
    # --inputs reproduces it, on the reference backend too.
    out2 = tmp_path / "o2.npz"
    rc, _, _ = call(capsys, "run", path, "--inputs", inp, "--backend", "reference", "-o", out2)
    assert rc == 0
    np.testing.assert_allclose(np.load(out2)["y"], want, rtol=1e-5, atol=1e-5)


def test_run_via_subprocess_with_shapes(tmp_path, dc_model):
    out = tmp_path / "o.npz"
    p = run_cli("run", dc_model[0], "--shape", "x:3x3x6x6", "--shape", "offset:3x18x6x6", "--shape",
                "mask:3x9x6x6:float32[0,1]", "-o", out, check=0)
    assert np.load(out)["y"].shape == (3, 5, 6, 6)
    assert "ort-cpu:" in p.stdout


# ------------------------------------------------------------------------------------------------
# compare, bench
# ------------------------------------------------------------------------------------------------
def test_compare_passes_and_prints_statistics(capsys, dc_model):
    rc, out, _ = call(capsys, "compare", dc_model[0], "--batch", 2, "--iterations", 2)
    assert rc == 0, out
    assert "comparing ort-cpu, reference" in out  # the reference runner is the partner of the one fast backend
    row = next(l for l in out.splitlines() if l.startswith("y "))
    max_abs, mean_abs, max_rel, mean_rel = map(float, row.split()[3:7])
    assert 0 <= mean_abs <= max_abs < 1e-4
    assert out.strip().endswith("PASSED")


def test_compare_mismatch_exits_1(capsys, roi_max_model):
    rc, out, _ = call(capsys, "compare", roi_max_model, "--backends", "ort-cpu,openvino", "--shape",
                      "batch_indices:3:int64[0,1]", "--shape", "rois:3x4:float32[0,7]")
    assert rc == 1, out
    row = next(l for l in out.splitlines() if l.startswith("y "))
    assert float(row.split()[3]) > 1e-3
    assert "FAILED" in out


def test_compare_subprocess_with_inputs_and_tolerances(tmp_path, dc_model):
    rng = np.random.default_rng(1)
    inp = tmp_path / "in.npz"
    np.savez(inp, x=rng.standard_normal((1, 3, 6, 6)).astype(np.float32),
             offset=rng.standard_normal((1, 18, 6, 6)).astype(np.float32),
             mask=rng.random((1, 9, 6, 6)).astype(np.float32))
    p = run_cli("compare", dc_model[0], "--inputs", inp, "--backends", "reference,ort-cpu", "--atol", "1e-3",
                "--rtol", "1e-3", check=0)
    assert "PASSED" in p.stdout and "atol=0.001" in p.stdout


def test_bench_prints_percentiles_and_throughput(capsys, tmp_path, dc_model):
    js = tmp_path / "b.json"
    rc, out, _ = call(capsys, "bench", dc_model[0], "--batch", 2, "--warmup", 1, "--iterations", 5, "--json", js,
                      "--backends", "ort-cpu,reference")
    assert rc == 0
    assert "p50 ms" in out and "p99 ms" in out and "samples/s" in out
    rows = json.loads(js.read_text())
    assert [r["backend"] for r in rows] == ["ort-cpu", "reference"]
    for r in rows:
        assert r["batch"] == 2 and r["iterations"] == 5
        assert 0 < r["p50_ms"] <= r["p90_ms"] <= r["p99_ms"]
        assert r["throughput"] == pytest.approx(2 / (r["mean_ms"] / 1e3))


# ------------------------------------------------------------------------------------------------
# export
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("custom", [False, True])
def test_export_factory_file_then_run_matches_torch(tmp_path, factory_file, custom, capsys):
    import torch

    out = tmp_path / "dcn.onnx"
    args = ["export", f"{factory_file}:build", "-o", out, "--input", "x:2x3x8x8", "--arg", "channels=5"]
    if custom:
        args.append("--custom-ops")
    rc, stdout, err = call(capsys, *args)
    assert rc == 0, err
    assert f"exported {out}" in stdout
    m = onnx.load(str(out))
    types = {(n.domain, n.op_type) for n in m.graph.node}
    assert (("dcnkit", "DeformConv2d") in types) if custom else (("", "DeformConv") in types)
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_param  # dynamic batch by default
    # Same weights: build the model the same way and compare with ONNX Runtime on a new batch size.
    sys.path.insert(0, str(factory_file.parent))
    try:
        import importlib

        mod = importlib.import_module("models")
        model = mod.build(channels=5).eval()
    finally:
        sys.path.pop(0)
    x = np.random.default_rng(0).standard_normal((3, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    rc, _, _ = call(capsys, "run", out, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "o.npz")
    assert rc == 0
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(np.load(tmp_path / "o.npz")["output"], want, rtol=1e-4, atol=1e-4)


def test_export_with_checkpoint_rois_and_fixed_batch(tmp_path, factory_file, capsys):
    import torch

    # checkpoint: a state_dict of another seed's model; the export must carry those weights.
    sys.path.insert(0, str(factory_file.parent))
    try:
        import importlib

        mod = importlib.import_module("models")
        torch.manual_seed(123)
        other = mod.DcnNet(4).eval()
    finally:
        sys.path.pop(0)
    ckpt = tmp_path / "ckpt.pt"
    torch.save(other.state_dict(), ckpt)
    out = tmp_path / "c.onnx"
    rc, _, err = call(capsys, "export", f"{factory_file}:build", "-o", out, "--input", "x:1x3x8x8", "--checkpoint",
                      ckpt, "--no-dynamic-batch")
    assert rc == 0, err
    m = onnx.load(str(out))
    assert m.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1
    x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
    from dcnkit.runtime.runners import make_runner

    with torch.no_grad():
        want = other(torch.from_numpy(x)).numpy()
    got = make_runner(out).run({"x": x})
    np.testing.assert_allclose(next(iter(got.values())), want, rtol=1e-4, atol=1e-4)

    # A checkpoint that does not fit: one line naming --checkpoint.
    torch.save({"nope": torch.zeros(1)}, tmp_path / "bad.pt")
    rc, _, err = call(capsys, "export", f"{factory_file}:build", "-o", out, "--input", "x:1x3x8x8", "--checkpoint",
                      tmp_path / "bad.pt")
    assert rc == 2 and err.startswith("dcnkit export: error: --checkpoint: expected a state_dict matching")

    # RoI inputs: valid generated RoIs; the exported RoIAlign runs and matches the NumPy reference.
    out = tmp_path / "roi.onnx"
    rc, _, err = call(capsys, "export", f"{factory_file}:build_roi", "-o", out, "--input", "x:2x3x8x8",
                      "--input", "rois:rois:6", "--custom-ops")
    assert rc == 0, err
    rc, _, _ = call(capsys, "run", out, "--batch", 2, "--shape", "rois:rois:5", "--save-inputs", tmp_path / "ri.npz",
                    "-o", tmp_path / "ro.npz")
    assert rc == 0
    feeds = np.load(tmp_path / "ri.npz")
    assert feeds["rois"].shape == (5, 5) and set(np.unique(feeds["rois"][:, 0])) <= {0.0, 1.0}
    want = ref.roi_align(feeds["x"], feeds["rois"], (2, 2), 1.0, 2, True)
    np.testing.assert_allclose(np.load(tmp_path / "ro.npz")["output"], want, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------------
# serve / triton-repo registration
# ------------------------------------------------------------------------------------------------
def test_server_commands_are_registered_by_the_server_module():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name in ("serve", "triton-repo"):
        assert name in sub.choices
        assert "unavailable" not in (sub.choices[name].description or "")


def test_cli_keeps_working_without_the_server_module(monkeypatch, capsys):
    real = cli.importlib.import_module

    def fake(name, *a, **k):
        if name == "dcnkit.server.cli":
            raise ImportError("no server here")
        return real(name, *a, **k)

    monkeypatch.setattr(cli.importlib, "import_module", fake)
    rc, out, _ = call(capsys, "backends")
    assert rc == 0 and "reference" in out
    rc, _, err = call(capsys, "serve")
    assert rc == 2 and err.startswith("dcnkit serve: error: serve: unavailable") and "no server here" in err


def test_random_inputs_of_roi_align_are_valid_and_runtime_errors_are_one_line(capsys, tmp_path):
    node = helper.make_node("RoiAlign", ["x", "rois", "batch_indices"], ["y"], output_height=2, output_width=2,
                            sampling_ratio=2)
    g = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", T.FLOAT, ["N", 2, 8, 8]),
         helper.make_tensor_value_info("rois", T.FLOAT, ["K", 4]),
         helper.make_tensor_value_info("batch_indices", T.INT64, ["K"])],
        [helper.make_tensor_value_info("y", T.FLOAT, None)],
    )
    path = tmp_path / "ra.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 16)], ir_version=10), str(path))
    # batch indices: the model's int64 without a dtype in the spec, values in [0, N).
    rc, out, err = call(capsys, "compare", path, "--batch", 3, "--shape", "rois:6x4:float32[0,7]",
                        "--shape", "batch_indices:6", "--iterations", 2)
    assert rc == 0, out + err
    rc, _, _ = call(capsys, "run", path, "--batch", 3, "--shape", "rois:6x4:float32[0,7]", "--shape",
                    "batch_indices:6", "--save-inputs", tmp_path / "i.npz")
    bi = np.load(tmp_path / "i.npz")["batch_indices"]
    assert rc == 0 and bi.dtype == np.int64 and bi.min() >= 0 and bi.max() <= 2
    # A failure inside a backend: one line, exit code 1.
    rc, _, err = call(capsys, "run", path, "--backend", "reference", "--batch", 1, "--shape", "rois:6x4",
                      "--shape", "batch_indices:5")
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert "RoiAlign: batch_indices: expected shape (6,), got (5,)" in err
