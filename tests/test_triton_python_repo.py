"""``dcnkit triton-repo --backend python``: the repository's layout and config (Triton's own schema), a repository
written by the command loaded by a plain ``tritonserver`` process started from the command line the command prints
(on 127.0.0.1, free ports), answering like the kit's ORT runner; and the one-line errors of ``--engine triton`` when
the wheel is missing or the backend stub could not start."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("tritonclient.grpc", reason="tritonclient[grpc] is not installed (Triton's config schema)")
import tritonclient.http as httpclient  # noqa: E402

from dcnkit.runtime import triton, triton_server  # noqa: E402
from dcnkit.runtime.base import BackendUnavailable  # noqa: E402
from dcnkit.server.cli import main as cli_main  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_triton_repo import _batch_model, _roi_model  # noqa: E402
from test_server_dcnkit_ops import needs_ort_lib  # noqa: E402
from test_triton_server import server_processes  # noqa: E402


def test_python_backend_repository(tmp_path):
    d = triton.write_repository(_batch_model(), tmp_path, name="m", backend="python", max_batch_size=4,
                                runner_backend="ort-cuda", kit_kernels=False)
    assert sorted(p.relative_to(d).as_posix() for p in d.rglob("*")) == [
        "1", "1/model.onnx", "1/model.py", "config.pbtxt"]
    cfg = triton.parse_config((d / "config.pbtxt").read_text())
    assert cfg.backend == "python" and cfg.platform == "" and cfg.max_batch_size == 4
    assert [t.name for t in cfg.input] == ["x", "s"] and list(cfg.input[1].dims) == [1]
    assert cfg.input[1].data_type == 10  # TYPE_FP16
    assert cfg.parameters["dcnkit_backend"].string_value == "ort-cuda"
    assert cfg.parameters["dcnkit_kit_kernels"].string_value == "false"
    assert cfg.instance_group[0].kind == 2 and not cfg.HasField("model_operations")  # KIND_CPU
    assert "from dcnkit.runtime.triton_python_model import TritonPythonModel" in (d / "1" / "model.py").read_text()
    assert triton.check_repository(d) == []
    (d / "1" / "model.onnx").unlink()
    assert triton.check_repository(d) == [f"{d / '1'}: missing model.onnx"]
    with pytest.raises(ValueError, match="runner_backend: expected one of ort-cpu, ort-cuda, got 'tensorrt'"):
        triton.write_repository(_batch_model(), tmp_path, name="n", backend="python", runner_backend="tensorrt")


def test_run_requests_batches_and_isolates_failures():
    from dcnkit.runtime.triton_python_model import run_requests

    calls = []

    def run(feeds):
        x = feeds["x"]
        calls.append(len(x))
        if (x < 0).any():
            raise ValueError("negative input")
        return {"y": x * 2}

    feeds = [{"x": np.full((n, 2), n, np.float32)} for n in (1, 2, 3)]
    out = run_requests(run, feeds, batching=True)
    assert calls == [6] and [r["y"].tolist() for r in out] == [[[2, 2]], [[4, 4]] * 2, [[6, 6]] * 3]
    calls.clear()
    feeds[1]["x"][0, 0] = -1
    out = run_requests(run, feeds, batching=True)  # the batch fails: each alone, only the bad one fails
    assert calls == [6, 1, 2, 3] and isinstance(out[1], ValueError) and out[2]["y"].shape == (3, 2)
    calls.clear()
    assert len(run_requests(run, feeds[:1] + feeds[2:], batching=False)) == 2 and calls == [1, 3]


@pytest.mark.skipif(triton_server.unavailable_reason() is not None,
                    reason=f"tritonserver cannot run here: {triton_server.unavailable_reason()}")
@needs_ort_lib
def test_plain_tritonserver_loads_a_written_repository(tmp_path, capsys):
    from dcnkit.runtime.registry import make_runner

    models = {"boxes": _roi_model(custom=True), "relu": _batch_model()}
    repo = tmp_path / "repo"
    for name, m in models.items():
        onnx.save(m, str(tmp_path / f"{name}.onnx"))
    assert cli_main(["triton-repo", str(tmp_path / "boxes.onnx"), "-o", str(repo), "--backend", "python"]) == 0
    assert "loaded by tritonserver here: boxes READY" in capsys.readouterr().out  # checked in a real server
    assert cli_main(["triton-repo", str(tmp_path / "relu.onnx"), "-o", str(repo), "--backend", "python",
                     "--no-load-check"]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("run here: ") and "tritonserver --model-repository=" in line
    ports = [triton_server.free_port() for _ in range(3)]
    command = line[len("run here: "):] + (
        f" --http-address=127.0.0.1 --http-port={ports[0]} --grpc-address=127.0.0.1 --grpc-port={ports[1]}"
        f" --metrics-address=127.0.0.1 --metrics-port={ports[2]}")
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", command], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    rng = np.random.default_rng(0)
    x = rng.random((2, 4, 16, 16), dtype=np.float32)
    rois = np.array([[0, 1, 1, 9, 9], [1, 0.5, 2, 14, 12], [0, 3, 3, 5, 15]], np.float32)
    xb = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    sb = rng.standard_normal((3, 1)).astype(np.float16)
    try:
        url = f"127.0.0.1:{ports[0]}"
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                if all(urllib.request.urlopen(f"http://{url}/v2/models/{n}/ready", timeout=2).status == 200
                       for n in models):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        with httpclient.InferenceServerClient(url) as c:
            for name, feeds in (("boxes", {"input": x, "rois": rois}), ("relu", {"x": xb, "s": sb})):
                inputs = []
                for k, v in feeds.items():
                    i = httpclient.InferInput(k, list(v.shape), "FP16" if v.dtype == np.float16 else "FP32")
                    i.set_data_from_numpy(v)
                    inputs.append(i)
                result = c.infer(name, inputs)
                with make_runner(tmp_path / f"{name}.onnx", "ort-cpu") as runner:
                    for k, want in runner.run(feeds).items():
                        np.testing.assert_array_equal(result.as_numpy(k), want)
            assert result.as_numpy("s_out").dtype == np.float16
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
                proc.wait(wait)
                break
            except ProcessLookupError:
                break
            except subprocess.TimeoutExpired:
                continue
    deadline = time.monotonic() + 5
    while server_processes(str(repo)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert server_processes(str(repo)) == []


def test_triton_engine_errors_are_one_line(tmp_path, monkeypatch, capsys):
    import importlib.util
    import sysconfig

    path = tmp_path / "m.onnx"
    onnx.save(_batch_model(), str(path))
    assert cli_main(["serve", str(path), "--engine", "triton", "--backend", "reference"]) == 2
    assert capsys.readouterr().err.strip() == (
        "dcnkit serve: backend: expected one of ort-cpu, ort-cuda with --engine triton, got 'reference'")

    real_var = sysconfig.get_config_var
    monkeypatch.setattr(sysconfig, "get_config_var", lambda k: "/nowhere/lib" if k == "LIBDIR" else real_var(k))
    with pytest.raises(BackendUnavailable, match="stub cannot start: .* tried /nowhere/lib/libpython3"):
        triton_server.python_library_dir()
    monkeypatch.undo()

    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "pytriton" else real_find(n, *a))
    assert cli_main(["serve", str(path), "--engine", "triton"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nvidia-pytriton wheel is not installed" in err
    assert "pip install --no-deps nvidia-pytriton==0.7.0" in err


@pytest.mark.skipif(triton_server.unavailable_reason() is not None,
                    reason=f"tritonserver cannot run here: {triton_server.unavailable_reason()}")
def test_check_loads_reports_what_triton_refuses(tmp_path):
    d = triton.write_repository(_batch_model(), tmp_path, name="broken", backend="python")
    (d / "1" / "model.onnx").write_bytes(b"not an onnx file")
    assert triton.check_repository(d) == []  # the files are all there: only loading finds it
    problems = triton_server.check_loads(tmp_path)
    assert len(problems) == 1 and "failed to load 'broken'" in problems[0] and "INVALID_PROTOBUF" in problems[0]
    assert server_processes(str(tmp_path)) == []
