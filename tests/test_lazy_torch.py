"""The deployment side runs without importing PyTorch (torch installed or not), and the training side still
finds dcnkit's operators whichever of torch and dcnkit is imported first.

Every check runs in a fresh interpreter: ``import dcnkit``, ``dcnkit.runtime``, ``dcnkit.server``, the CLI's
``run`` / ``compare`` / ``bench`` / ``backends`` / ``--help`` and ``serve`` on ONNX Runtime leave ``torch`` out of
``sys.modules`` (and the server stays under 150 MB resident after serving a DCNv2 model); after
``import dcnkit``, a later ``import torch`` loads the operators, so plain ``torch.onnx.export`` writes our nodes,
``torch.jit.load`` finds the ops and ``dcnkit.ops`` / ``dcnkit.nn`` work as attributes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from server_process import free_port, serving

import dcnkit

ROOT = Path(__file__).resolve().parents[1]
PKG_PARENT = str(Path(dcnkit.__file__).resolve().parents[1])
RSS_LIMIT_MB = 150

# Reports, at interpreter exit, whether torch was imported and the process's resident memory.
_REPORT = textwrap.dedent("""
    import atexit, json, sys
    def _report(path=sys.argv.pop(1)):
        status = open("/proc/self/status").read().split("\\n")
        kb = {l.split(":")[0]: int(l.split()[1]) for l in status if l.startswith(("VmRSS", "VmHWM"))}
        with open(path, "w") as f:
            json.dump({"torch": "torch" in sys.modules, "rss_kb": kb.get("VmRSS"), "hwm_kb": kb.get("VmHWM"),
                       "torch_modules": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))[:5]},
                      f)
    atexit.register(_report)
""")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([PKG_PARENT] + [p for p in [env.get("PYTHONPATH")] if p])
    env.pop("DCNKIT_DEBUG", None)
    return env


def _python(code: str, tmp_path: Path, *args: str, timeout: int = 300) -> tuple[subprocess.CompletedProcess, dict]:
    """Runs ``code`` in a fresh interpreter; returns the process and its exit report."""
    report = tmp_path / f"report_{time.monotonic_ns()}.json"
    p = subprocess.run([sys.executable, "-c", _REPORT + textwrap.dedent(code), str(report), *args],
                       capture_output=True, text=True, timeout=timeout, env=_env(), cwd=tmp_path)
    assert p.returncode == 0, f"rc={p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p, json.loads(report.read_text())


def _cli(tmp_path: Path, *argv: str, rc: int = 0) -> tuple[subprocess.CompletedProcess, dict]:
    """``python -m dcnkit ARGV`` in a fresh interpreter (through runpy, as ``-m`` does)."""
    code = f"""
        import runpy, sys
        sys.argv = ["dcnkit"] + {list(argv)!r}
        try:
            runpy.run_module("dcnkit", run_name="__main__", alter_sys=True)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            open({str(tmp_path / 'rc')!r}, "w").write(str(code))
    """
    p, report = _python(code, tmp_path)
    got = int((tmp_path / "rc").read_text())
    assert got == rc, f"rc={got}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p, report


def _dcnv2_model(cin=16, cout=16, hw=32, seed=0) -> onnx.ModelProto:
    """A DCNv2 layer as the kit's node: dcnkit::DeformConv2d 3x3, padding 1, with mask; batch is symbolic."""
    rng = np.random.default_rng(seed)
    x = helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", cin, hw, hw])
    off = helper.make_tensor_value_info("offset", TensorProto.FLOAT, ["batch", 18, hw, hw])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 9, hw, hw])
    y = helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", cout, hw, hw])
    node = helper.make_node("DeformConv2d", ["input", "offset", "weight", "bias", "mask"], ["output"],
                            domain="dcnkit", stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1,
                            deformable_groups=1)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal((cout, cin, 3, 3)) * 0.1).astype(np.float32),
                                          "weight"),
             onnx.numpy_helper.from_array(rng.standard_normal(cout).astype(np.float32), "bias")]
    g = helper.make_graph([node], "dcnv2", [x, off, mask], [y], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dcnkit", 1)])
    m.ir_version = 9
    return m


def _have_ort_library() -> bool:
    try:
        dcnkit.ort_library()
        return True
    except FileNotFoundError:
        return False


needs_ort_lib = pytest.mark.skipif(not _have_ort_library(), reason="the kit's ONNX Runtime library is not built")


@pytest.fixture(scope="module")
def dcn_onnx(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("lazy") / "dcnv2.onnx"
    onnx.save(_dcnv2_model(), str(path))
    return path


# ---- the deployment side -------------------------------------------------------------------------------


def test_import_dcnkit_runtime_server_leave_torch_out(tmp_path):
    _, r = _python("""
        import dcnkit
        assert dcnkit.__version__ and "torch" not in sys.modules
        import dcnkit.runtime, dcnkit.runtime.ort, dcnkit.runtime.runners, dcnkit.runtime.precision
        import dcnkit.server, dcnkit.server.app, dcnkit.server.cli
        import dcnkit.export.schemas, dcnkit.reference, dcnkit.polygraphy_ext, dcnkit.cli
        assert dcnkit.runtime.ort.default_providers()[-1] == "CPUExecutionProvider"
        assert dcnkit.runtime.runners.available_backends()["ort-cpu"] is None
        dcnkit.export.schemas.register_onnx_schemas()
        print(sorted(dcnkit.op_defs()["ops"][i]["name"] for i in range(4)))
    """, tmp_path)
    assert r["torch"] is False, r["torch_modules"]


@needs_ort_lib
def test_ort_session_of_dcnv2_without_torch(tmp_path, dcn_onnx):
    p, r = _python("""
        import numpy as np
        from dcnkit.runtime import ort_session
        sess = ort_session(sys.argv[1], providers=["CPUExecutionProvider"])
        rng = np.random.default_rng(0)
        feeds = {"input": rng.standard_normal((1, 16, 32, 32), dtype=np.float32),
                 "offset": rng.standard_normal((1, 18, 32, 32), dtype=np.float32),
                 "mask": rng.uniform(size=(1, 9, 32, 32)).astype(np.float32)}
        out = sess.run(None, feeds)[0]
        print(out.shape, float(np.abs(out).sum()) > 0)
    """, tmp_path, str(dcn_onnx))
    assert p.stdout.strip() == "(1, 16, 32, 32) True"
    assert r["torch"] is False, r["torch_modules"]


@needs_ort_lib
@pytest.mark.parametrize("argv", [
    ["--help"],
    ["run", "--help"],
    ["backends"],
    ["run", "{model}", "--backend", "ort-cpu", "--batch", "2", "-o", "{tmp}/out.npz"],
    ["compare", "{model}", "--backends", "ort-cpu,reference"],
    ["compare", "{model}"],
    ["bench", "{model}", "--backends", "ort-cpu", "--iterations", "3", "--warmup", "1"],
    ["serve", "--help"],
    ["triton-repo", "{model}", "-o", "{tmp}/repo"],
], ids=["help", "run-help", "backends", "run", "compare-ort-reference", "compare-default", "bench", "serve-help",
        "triton-repo"])
def test_cli_deployment_commands_leave_torch_out(tmp_path, dcn_onnx, argv):
    argv = [a.format(model=dcn_onnx, tmp=tmp_path) for a in argv]
    p, r = _cli(tmp_path, *argv)
    assert r["torch"] is False, (r["torch_modules"], p.stdout, p.stderr)
    if argv[0] == "run" and "--help" not in argv:
        with np.load(tmp_path / "out.npz") as z:
            assert z["output"].shape == (2, 16, 32, 32)
    if argv[0] == "compare":
        assert "PASSED" in p.stdout, p.stdout
    if argv[0] == "bench":
        assert "ort-cpu" in p.stdout
    if argv[0] == "triton-repo":
        assert (tmp_path / "repo" / "dcnv2" / "config.pbtxt").is_file()


def _vm_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


@needs_ort_lib
def test_served_dcnv2_model_without_torch_under_150_mb(tmp_path, dcn_onnx):
    httpclient = pytest.importorskip("tritonclient.http")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    port = free_port()
    report = tmp_path / "server_report.json"
    code = _REPORT + textwrap.dedent(f"""
        import sys
        from dcnkit.cli import main
        sys.exit(main(["serve", {str(dcn_onnx)!r}, "--host", "127.0.0.1", "--port", "{port}", "--backend",
                       "ort-cpu", "--max-batch-size", "2", "--log-level", "warning"]))
    """)
    with serving([sys.executable, "-c", code, str(report)], port, env=_env(), cwd=tmp_path) as proc:
        c = httpclient.InferenceServerClient(url=f"127.0.0.1:{port}")
        rng = np.random.default_rng(1)
        arrays = {"input": rng.standard_normal((1, 16, 32, 32), dtype=np.float32),
                  "offset": rng.standard_normal((1, 18, 32, 32), dtype=np.float32),
                  "mask": rng.uniform(size=(1, 9, 32, 32)).astype(np.float32)}
        inputs = []
        for name, a in arrays.items():
            i = httpclient.InferInput(name, list(a.shape), "FP32")
            i.set_data_from_numpy(a)
            inputs.append(i)
        got = c.infer("dcnv2", inputs).as_numpy("output")
        c.close()
        # The served result is the operator's: the NumPy reference of docs/operators.md.
        from dcnkit import reference

        m = onnx.load(str(dcn_onnx))
        w, b = (onnx.numpy_helper.to_array(t) for t in m.graph.initializer)
        want = reference.deform_conv2d(arrays["input"].astype(np.float64), arrays["offset"].astype(np.float64),
                                       w.astype(np.float64), b.astype(np.float64), stride=(1, 1), padding=(1, 1),
                                       dilation=(1, 1), mask=arrays["mask"].astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        rss_mb = _vm_kb(proc.pid, "VmRSS") / 1024
    r = json.loads(report.read_text())
    assert r["torch"] is False, r["torch_modules"]
    print(f"server RSS after one DCNv2 request: {rss_mb:.1f} MB (at exit {r['rss_kb'] / 1024:.1f} MB, "
          f"peak {r['hwm_kb'] / 1024:.1f} MB)")
    assert rss_mb < RSS_LIMIT_MB, f"server RSS {rss_mb:.1f} MB"
    assert r["rss_kb"] / 1024 < RSS_LIMIT_MB


# ---- the training side still finds the operators ----------------------------------------------------------


def test_torch_imported_first_loads_the_ops_at_once(tmp_path):
    p, r = _python("""
        import torch
        import dcnkit
        assert hasattr(torch.ops.dcnkit, "roi_align") and "dcnkit.ops" in sys.modules
        assert not any(type(f).__name__ == "TorchImportHook" for f in sys.meta_path)
        print("ok")
    """, tmp_path)
    assert p.stdout.strip() == "ok" and r["torch"] is True


def test_torch_imported_later_loads_the_ops_and_removes_the_hook(tmp_path):
    p, _ = _python("""
        import dcnkit
        assert "torch" not in sys.modules and "dcnkit.ops" not in sys.modules
        hooks = [f for f in sys.meta_path if type(f).__name__ == "TorchImportHook"]
        assert len(hooks) == 1
        import dcnkit.runtime  # a second import of dcnkit's modules adds no second hook
        import importlib; importlib.reload(dcnkit)
        assert len([f for f in sys.meta_path if type(f).__name__ == "TorchImportHook"]) == 1
        import torch
        assert "dcnkit.ops" in sys.modules and "dcnkit.export._register" in sys.modules
        assert not any(type(f).__name__ == "TorchImportHook" for f in sys.meta_path)
        x = torch.arange(64.0).reshape(1, 1, 8, 8)
        y = torch.ops.dcnkit.roi_align(x, torch.tensor([[0.0, 0, 0, 7, 7]]), 2, 2, 1.0, 2, True, "avg")
        print(tuple(y.shape))
    """, tmp_path)
    assert p.stdout.strip() == "(1, 1, 2, 2)"


def test_torch_imported_through_another_package_later(tmp_path):
    """torchvision imports torch: the ops load then, and a model mixing both works."""
    pytest.importorskip("torchvision")
    p, _ = _python("""
        import dcnkit
        import torchvision
        import torch
        x = torch.randn(1, 2, 8, 8)
        rois = torch.tensor([[0.0, 1, 1, 6, 5]])
        a = torch.ops.dcnkit.roi_align(x, rois, 2, 2, 1.0, 2, False, "avg")
        b = torchvision.ops.roi_align(x, rois, (2, 2), 1.0, 2, False)
        torch.testing.assert_close(a, b)
        print("ok")
    """, tmp_path)
    assert p.stdout.strip() == "ok"


def test_ops_and_nn_as_attributes_after_import_dcnkit(tmp_path):
    p, r = _python("""
        import dcnkit
        roi_align = dcnkit.ops.roi_align        # imports torch (and with it the operators)
        import torch
        m = dcnkit.nn.ModulatedDeformConv2dPack(2, 3, 3, padding=1)
        y = m(torch.randn(1, 2, 6, 6))
        x = torch.arange(64.0).reshape(1, 1, 8, 8)
        z = roi_align(x, torch.tensor([[0.0, 0, 0, 7, 7]]), (2, 2), 1.0, 2, True)
        from dcnkit.nn import RoIAlign
        from dcnkit import ops, nn
        assert ops is dcnkit.ops and nn is dcnkit.nn and "ops" in dir(dcnkit)
        print(tuple(y.shape), tuple(z.shape), RoIAlign.__name__)
    """, tmp_path)
    assert p.stdout.strip() == "(1, 3, 6, 6) (1, 1, 2, 2) RoIAlign"
    assert r["torch"] is True


def test_unknown_attribute_still_raises(tmp_path):
    p, r = _python("""
        import dcnkit
        try:
            dcnkit.no_such_thing
        except AttributeError as e:
            print(e)
    """, tmp_path)
    assert "no_such_thing" in p.stdout and r["torch"] is False


_EXPORT_CHILD = """
    import dcnkit                       # before torch: the operators load when torch is imported
    assert "torch" not in sys.modules
    import io
    import onnx
    import torch

    class Net(torch.nn.Module):
        def forward(self, x, rois, offset):
            a = torch.ops.dcnkit.roi_align(x, rois, 2, 2, 0.5, 2, True, "max")
            b = torch.ops.dcnkit.deform_roi_pool(x, rois, offset, 2, 2, 0.5, 2, 0.1)
            return a + b

    args = (torch.randn(1, 3, 8, 8), torch.tensor([[0.0, 1, 1, 10, 12]]), torch.zeros(1, 2, 2, 2))
    for dynamo in sys.argv[1].split(","):
        f = io.BytesIO()
        torch.onnx.export(Net(), args, f, dynamo=dynamo == "dynamo", opset_version=18)
        model = onnx.load_from_string(f.getvalue())
        print(dynamo, sorted({(n.domain, n.op_type) for n in model.graph.node if n.domain == "dcnkit"}))
"""


@pytest.mark.parametrize("exporter", ["legacy", "dynamo"])
def test_plain_torch_onnx_export_after_import_dcnkit_before_torch(tmp_path, exporter):
    p, _ = _python(_EXPORT_CHILD, tmp_path, exporter)
    assert p.stdout.strip().splitlines()[-1] == (
        f"{exporter} [('dcnkit', 'DeformRoIPool'), ('dcnkit', 'RoIAlign')]"), p.stdout + p.stderr


def test_torchscript_load_after_import_dcnkit_before_torch(tmp_path):
    import torch

    from dcnkit.nn import DeformRoIPoolPack, RoIAlign

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.align = RoIAlign(2, 0.5, 2)
            self.pool = DeformRoIPoolPack(2, 3, 8, 0.5)

        def forward(self, x, rois):
            return self.align(x, rois) + self.pool(x, rois)

    m = Net().eval()
    x, rois = torch.randn(1, 3, 8, 8), torch.tensor([[0.0, 1, 1, 10, 12], [0.0, 0, 2, 14, 9]])
    torch.jit.save(torch.jit.script(m), str(tmp_path / "m.pt"))
    with torch.no_grad():
        expected = m(x, rois)
    torch.save((x, rois), tmp_path / "in.pt")
    _python("""
        import dcnkit
        import torch
        m = torch.jit.load(sys.argv[1])
        x, rois = torch.load(sys.argv[2])
        with torch.no_grad():
            torch.save(m(x, rois), sys.argv[3])
    """, tmp_path, str(tmp_path / "m.pt"), str(tmp_path / "in.pt"), str(tmp_path / "out.pt"))
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), expected, rtol=0, atol=0)


def test_a_broken_torch_side_does_not_break_import_torch(tmp_path):
    """When dcnkit's operators cannot load (here: made to fail), `import torch` still works, with a warning;
    dcnkit.ops then raises the error itself."""
    p, _ = _python("""
        import warnings
        import dcnkit, dcnkit._torch_side as side
        side.TORCH_SIDE_MODULES = ("dcnkit._no_such_module",)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import torch
        assert torch.ones(2).sum().item() == 2.0
        print([str(x.message).split(" (")[0] for x in w if "dcnkit" in str(x.message)])
    """, tmp_path)
    assert p.stdout.strip() == "['dcnkit: could not load its PyTorch operators after `import torch`']"


def test_polygraphy_torch_checks_do_not_import_torch_but_still_see_tensors(tmp_path):
    """Polygraphy imports torch to ask whether an array is a torch tensor; with dcnkit's stand-in it asks
    only when torch is imported already, and still recognises torch tensors then."""
    pytest.importorskip("polygraphy")
    p, r = _python("""
        import numpy as np
        import dcnkit.polygraphy_ext  # installs the stand-in
        from polygraphy import util
        from polygraphy.datatype import DataType
        assert util.array.is_torch(np.zeros(2)) is False
        assert DataType.from_dtype(np.dtype("float32")) == DataType.FLOAT32
        assert "torch" not in sys.modules
        import torch
        assert util.array.is_torch(torch.zeros(2)) is True and util.array.is_torch(np.zeros(2)) is False
        assert DataType.from_dtype(torch.float16) == DataType.FLOAT16
        print("ok")
    """, tmp_path)
    assert p.stdout.strip() == "ok" and r["torch"] is True
