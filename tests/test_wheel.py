"""The wheel that ships (issue 30), as a new user makes and installs it: `pip wheel` from a clean clone, once with
the venv activated and once not (the first ``python3`` on PATH is then a stand-in that fails the build if anything
calls it), then the wheel installed into a fresh venv without torch, where ``dcnkit backends``, ``dcnkit run`` on a
model this test exports and ``dcnkit serve`` answering one request work.

To stay within CI's budget the two wheels are CPU builds of the ONNX Runtime library alone (PyTorch library,
CUDA and TensorRT off): what the deployment box runs, and all that the two points need (the Python that runs the
build is the one CMake uses; the ONNX Runtime library is in the wheel, its headers given by
DCNKIT_ORT_INCLUDE_DIR in one build and found by the build itself in the other). The deployment venv gets the
wheel and the light server's part of the ``serve`` extra (not ``nvidia-pytriton``, the Triton engine's: large,
and not used by ``dcnkit serve``), at the versions of requirements-dev.txt; and a second one the same with the
oldest ONNX Runtime the wheel declares (``onnxruntime>=1.16``: 1.16.3, with NumPy 1 as that release needs), where
the same three checks run (issue 35).

Marked ``wheel`` (a few minutes): CI runs it; ``-m "not wheel"`` leaves it out locally."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from email.parser import Parser
from pathlib import Path

import numpy as np
import pytest
from server_process import free_port, serving

pytestmark = pytest.mark.wheel

ROOT = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
CPU_ONLY = [f"--config-settings=cmake.define.{k}=OFF"
            for k in ("DCNKIT_WITH_CUDA", "DCNKIT_BUILD_TORCH", "DCNKIT_BUILD_TENSORRT")]
NO_OPENVINO = "--config-settings=cmake.define.DCNKIT_BUILD_OPENVINO=OFF"
# The openvino wheel (the [openvino] extra, installed by scripts/setup.sh) builds libdcnkit_ov.so into the wheel.
OPENVINO = importlib.util.find_spec("openvino") is not None
# What neither the builds nor the deployment venv may inherit from the test's own environment.
_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "DCNKIT_LIB_DIR", "DCNKIT_ORT_INCLUDE_DIR", "TensorRT_ROOT",
         "TensorRT_INCLUDE_DIR", "CMAKE_ARGS", "SKBUILD_CMAKE_ARGS", "DCNKIT_DEBUG")


def _ort_headers() -> Path | None:
    for d in (os.environ.get("DCNKIT_ORT_INCLUDE_DIR"), ROOT / ".deps" / "onnxruntime" / "include"):
        if d and (Path(d) / "onnxruntime_c_api.h").is_file():
            return Path(d)
    return None


if shutil.which("git") is None:
    pytest.skip("git is needed to clone the repository", allow_module_level=True)
if _ort_headers() is None:
    pytest.skip("no ONNX Runtime headers here (DCNKIT_ORT_INCLUDE_DIR or .deps/onnxruntime/include: "
                "bash scripts/setup.sh provides them)", allow_module_level=True)
pytest.importorskip("scikit_build_core", reason="the wheel is built by scikit-build-core (requirements-dev.txt)")


def _env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _DROP}
    env.update(CMAKE_BUILD_PARALLEL_LEVEL="2", **extra)
    return env


def _run(cmd, env, cwd, timeout=600) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{cmd} -> {p.returncode}\nstdout:\n{p.stdout[-6000:]}\nstderr:\n{p.stderr[-6000:]}"
    return p


def _pip_wheel(src: Path, dist: Path, env: dict, *extra: str) -> tuple[Path, str]:
    p = _run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-v", "-w", dist, *CPU_ONLY,
              *extra, "."], env, src)
    (wheel,) = dist.glob("dcnkit-*.whl")
    (summary,) = [line.strip() for line in (p.stdout + p.stderr).splitlines() if "dcnkit build: " in line]
    return wheel, summary.split("-- ", 1)[-1]


def _native_libraries(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return sorted(n for n in z.namelist() if n.endswith(".so"))


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict:
    """name -> (wheel, the build's summary line, clone): the activated and the plain (not activated) venv."""
    base = tmp_path_factory.mktemp("wheels")
    out = {}
    # 1. Activated: the venv's bin first on PATH, VIRTUAL_ENV set; the headers given by DCNKIT_ORT_INCLUDE_DIR.
    src = base / "clone-activated"
    _run(["git", "clone", "-q", ROOT, src], _env(), base)
    env = _env(VIRTUAL_ENV=sys.prefix, PATH=f"{VENV_BIN}{os.pathsep}{os.environ['PATH']}",
               DCNKIT_ORT_INCLUDE_DIR=str(_ort_headers()))
    # (the OpenVINO extension library only in the other build: the one the deployment venv installs)
    out["activated"] = (*_pip_wheel(src, base / "dist-activated", env, NO_OPENVINO), src)
    # 2. Not activated: PATH's first python3 is a stand-in that records its call and fails; no header folder given:
    #    the build finds the clone's .deps as scripts/setup.sh leaves it (a copy here, so nothing is fetched).
    src = base / "clone-plain"
    _run(["git", "clone", "-q", ROOT, src], _env(), base)
    shutil.copytree(_ort_headers(), src / ".deps" / "onnxruntime" / "include")
    decoy = base / "decoy-bin"
    decoy.mkdir()
    for name in ("python", "python3", f"python3.{sys.version_info.minor}"):
        (decoy / name).write_text(f"#!/bin/sh\necho \"$0 $*\" >> {base / 'decoy-called'}\nexit 3\n")
        (decoy / name).chmod(0o755)
    path = [p for p in os.environ["PATH"].split(os.pathsep) if Path(p).resolve() != VENV_BIN.resolve()]
    env = _env(PATH=os.pathsep.join([str(decoy), *path]))
    assert shutil.which("python3", path=env["PATH"]) == str(decoy / "python3")
    out["plain"] = (*_pip_wheel(src, base / "dist-plain", env), src)
    assert not (base / "decoy-called").exists(), (base / "decoy-called").read_text()
    return out


@pytest.mark.parametrize("how", ["activated", "plain"])
def test_the_build_uses_its_own_python_and_ships_the_onnx_runtime_library(wheels, how):
    wheel, summary, src = wheels[how]
    print(f"{how}: {wheel.name} ({wheel.stat().st_size / 1e6:.2f} MB): {_native_libraries(wheel)}\n  {summary}")
    assert summary.startswith(f"dcnkit build: Python {sys.executable} | ")
    headers = _ort_headers() if how == "activated" else src / ".deps" / "onnxruntime" / "include"
    assert f"| ONNX Runtime: libdcnkit_ort.so (headers {headers})" in summary
    for what, why in (("PyTorch", "DCNKIT_BUILD_TORCH=OFF"), ("ONNX Runtime CUDA", "DCNKIT_WITH_CUDA=OFF"),
                      ("TensorRT", "DCNKIT_BUILD_TENSORRT=OFF")):
        assert f"| {what}: not built ({why})" in summary
    # the torch-free wheel ships the OpenVINO extension library, built against the openvino wheel's CMake package
    with_ov = how == "plain" and OPENVINO
    if with_ov:
        assert re.search(r"\| OpenVINO: libdcnkit_ov\.so \(OpenVINO 20\d\d\.", summary), summary
    elif how == "activated":
        assert "| OpenVINO: not built (DCNKIT_BUILD_OPENVINO=OFF)" in summary
    ov_lib = ["dcnkit/lib/libdcnkit_ov.so"] if with_ov else []
    assert _native_libraries(wheel) == ["dcnkit/lib/libdcnkit_ort.so"] + ov_lib


def _requires(wheel: Path) -> dict[str, list[str]]:
    """The wheel's Requires-Dist by extra ("" for the base install): project names only."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        msg = Parser().parsestr(z.read(meta).decode())
    out: dict[str, list[str]] = {}
    for req in msg.get_all("Requires-Dist") or []:
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0).lower()
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        out.setdefault(extra.group(1) if extra else "", []).append(name)
    return out


def test_extras_match_the_jobs(wheels):
    req = _requires(wheels["plain"][0])
    assert set(req) == {"", "serve", "torch", "tools", "test", "openvino", "transformers", "ultralytics"}
    assert req["openvino"] == ["openvino"]
    assert {"ultralytics", "onnxslim"} <= set(req["ultralytics"])  # dcnkit.integrations.ultralytics
    assert req["transformers"] == ["transformers"]  # dcnkit.integrations.transformers
    assert {"onnxruntime", "onnx", "numpy", "scipy-openblas32"} <= set(req[""])
    # oneDNN 3.x from PyPI: the packed-weight CPU GEMM of the ONNX Runtime / OpenVINO libraries (Linux x86-64 wheels)
    assert "onednn-cpu-gomp" in req[""], req[""]
    assert {"fastapi", "uvicorn", "prometheus-client", "nvidia-pytriton"} <= set(req["serve"])
    assert {"torch", "torchvision"} <= set(req["torch"]) and "polygraphy" in req["tools"]
    for extra in ("", "serve", "tools"):  # a deployment install pulls no torch
        assert not {"torch", "torchvision"} & set(req[extra]), (extra, req[extra])


# ---- the deployment box: a fresh venv without torch -------------------------------------------------------


# The oldest ONNX Runtime the wheel declares (pyproject.toml) and the NumPy that release is built against.
FLOOR_PINS = {"onnxruntime": "onnxruntime==1.16.3", "numpy": "numpy==1.26.4"}


def _constraints(path: Path, overrides: dict | None = None) -> Path:
    """requirements-dev.txt's pins as a constraints file (constraints take no extras), with ``overrides``
    (project name -> requirement) in place of those projects' pins."""
    lines = [re.sub(r"\[[^]]*\]", "", line) for line in (ROOT / "requirements-dev.txt").read_text().splitlines()]
    for name, req in (overrides or {}).items():
        lines = [line for line in lines if not re.match(rf"{name}\s*[=<>!~]", line)] + [req]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def dcn_model(tmp_path_factory) -> tuple[Path, dict, np.ndarray]:
    """A DCNv2 layer exported by this test as the kit's node (dcnkit::DeformConv2d), its inputs, and the
    output of the NumPy reference (docs/operators.md) in float64."""
    torch = pytest.importorskip("torch", reason="the model is exported with PyTorch")
    import dcnkit
    from dcnkit import reference

    class DCNv2(torch.nn.Module):
        def __init__(self):
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.weight = torch.nn.Parameter(torch.randn(6, 4, 3, 3, generator=g) * 0.2)
            self.bias = torch.nn.Parameter(torch.randn(6, generator=g))

        def forward(self, input, offset, mask):
            return dcnkit.ops.deform_conv2d(input, offset, self.weight, self.bias, padding=1, mask=mask)

    rng = np.random.default_rng(1)
    feeds = {"input": rng.standard_normal((1, 4, 8, 8), dtype=np.float32),
             "offset": (rng.standard_normal((1, 18, 8, 8)) * 2).astype(np.float32),
             "mask": rng.uniform(size=(1, 9, 8, 8)).astype(np.float32)}
    m = DCNv2().eval()
    path = tmp_path_factory.mktemp("model") / "dcnv2.onnx"
    # opset 19 (IR 9): what the oldest ONNX Runtime the wheel declares reads
    dcnkit.export.to_onnx(m, tuple(torch.from_numpy(a) for a in feeds.values()), path, standard_ops=False,
                          dynamo=False, opset=19)
    want = reference.deform_conv2d(feeds["input"], feeds["offset"], m.weight.detach().numpy(),
                                   m.bias.detach().numpy(), padding=(1, 1), mask=feeds["mask"])
    return path, feeds, want


@pytest.fixture(scope="module", params=["pinned", "floor"])
def deploy_venv(wheels, tmp_path_factory, request) -> tuple[Path, dict]:
    """A fresh venv holding the (not activated) build's wheel and the light server; no torch. ``floor``: with
    the oldest ONNX Runtime the wheel declares."""
    base = tmp_path_factory.mktemp(f"deploy-{request.param}")
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", venv], _env(), base)
    wheel = wheels["plain"][0]
    server = [r for r in _requires(wheel)["serve"] if r != "nvidia-pytriton"]
    overrides = FLOOR_PINS if request.param == "floor" else None
    _run([venv / "bin" / "python", "-m", "pip", "install", "-q", "-c",
          _constraints(base / "constraints.txt", overrides), wheel, *server], _env(), base, timeout=900)
    env = _env(PATH=f"{venv / 'bin'}{os.pathsep}/usr/bin{os.pathsep}/bin", HOME=str(base))
    p = _run([venv / "bin" / "python", "-c", "import importlib.util as u; print(u.find_spec('torch'))"], env, base)
    assert p.stdout.strip() == "None", "the deployment venv must not have torch"
    if request.param == "floor":
        p = _run([venv / "bin" / "python", "-c", "import onnxruntime; print(onnxruntime.__version__)"], env, base)
        assert p.stdout.strip() == FLOOR_PINS["onnxruntime"].split("==")[1]
    return venv, env


def test_installed_wheel_lists_its_backends_and_libraries(deploy_venv):
    venv, env = deploy_venv
    out = _run([venv / "bin" / "dcnkit", "backends"], env, venv).stdout
    print(out)
    backends, libs = out.strip().split("\n\n")
    assert re.search(r"^ort-cpu +available$", backends, re.M) and re.search(r"^reference +available$", backends, re.M)
    site_lib = next((venv / "lib").glob("python3.*/site-packages/dcnkit/lib"))
    assert re.search(rf"^  libdcnkit_ort\.so +{re.escape(str(site_lib / 'libdcnkit_ort.so'))}$", libs, re.M), libs
    assert re.search(r"^  libdcnkit_torch\.so +not in this build$", libs, re.M), libs
    if OPENVINO:  # shipped; the backend asks for its extra (the deployment venv has no openvino)
        assert re.search(rf"^  libdcnkit_ov\.so +{re.escape(str(site_lib / 'libdcnkit_ov.so'))}$", libs, re.M), libs
        assert re.search(r"^openvino +unavailable: openvino is not installed .*dcnkit\[openvino\]", backends, re.M)


def test_installed_wheel_runs_an_exported_model(deploy_venv, dcn_model, tmp_path):
    venv, env = deploy_venv
    path, feeds, want = dcn_model
    np.savez(tmp_path / "in.npz", **feeds)
    p = _run([venv / "bin" / "dcnkit", "run", path, "--inputs", tmp_path / "in.npz", "-o", tmp_path / "out.npz"],
             env, tmp_path)
    print(p.stdout)
    # the wheel's declared oneDNN is found in the fresh venv: the constant weight is packed (no OpenBLAS line)
    assert "weights not packed" not in p.stderr, p.stderr
    with np.load(tmp_path / "out.npz") as z:
        np.testing.assert_allclose(z["output"], want, rtol=1e-4, atol=1e-4)


def test_installed_wheel_serves_one_request(deploy_venv, dcn_model, tmp_path):
    venv, env = deploy_venv
    path, feeds, want = dcn_model
    port = free_port()
    with serving([venv / "bin" / "dcnkit", "serve", path, "--host", "127.0.0.1", "--port", port, "--log-level",
                  "warning"], port, env=env, cwd=tmp_path):
        body = {"inputs": [{"name": k, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
                           for k, a in feeds.items()]}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{path.stem}/infer",
                                     data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            (out,) = json.loads(r.read())["outputs"]
    assert out["name"] == "output" and out["shape"] == list(want.shape)
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(want.shape), want, rtol=1e-4, atol=1e-4)
