"""The ONNX Runtime version matrix (issue 35): the kit's custom-op library in every ONNX Runtime release it supports.

Throwaway venvs hold nothing but ``onnxruntime`` and NumPy (NumPy 1 before 1.19): 1.16.3, 1.17.3, 1.18.1, 1.19.2,
1.20.1, 1.22.1, 1.24.4 and the newest (``NEWEST``), plus 1.15.1, the release below the floor. They are made in
parallel while this process exports the cases, from pip's cache (``pip --python VENV install --no-deps --no-compile``;
the first run downloads the wheels). In each venv ``tests/ort_matrix_runner.py`` (no dcnkit import) registers
``libdcnkit_ort.so`` by path and runs every case of ``tests/ort_matrix_cases.py`` (kit-domain, standard and
mmdeploy/mmcv-named one-node files of every operator family, exported or written at opset 19, and a DCN ResNet)
against the outputs eager PyTorch gave on the same inputs (1e-4 relative). 1.15.1 must refuse the library in one line
naming the floor and the version found. The C++ runner (runtime/cpp) is built against the oldest and the newest
release's ``libonnxruntime.so`` and runs the model and a kit-domain file (1.16.3's library is not in its wheel: it
comes from npm's ``onnxruntime-node``; without npm that part skips).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(__file__).with_name("ort_matrix_runner.py")
OLDEST = "1.16.3"
NEWEST = "1.32.0"  # the newest release on PyPI when this was written (the kit's pin, requirements-dev.txt: 1.31.1)
VERSIONS = [OLDEST, "1.17.3", "1.18.1", "1.19.2", "1.20.1", "1.22.1", "1.24.4", NEWEST]
BELOW_FLOOR = "1.15.1"
REFUSAL = f"dcnkit: this custom-op library needs ONNX Runtime >= 1.16.0; found ONNX Runtime {BELOW_FLOOR}"


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _numpy_for(version: str) -> str:
    if _key(version) < (1, 19):
        return "numpy==1.26.4"  # releases before 1.19 are built against NumPy 1
    return f"numpy=={np.__version__}"  # the kit's own (in pip's cache already)


def _start_venv(base: Path, version: str) -> tuple[Path, subprocess.Popen]:
    venv = base / f"ort-{version}"
    py = venv / "bin" / "python"
    script = (f"{sys.executable} -m venv --without-pip {venv} && "
              f"{sys.executable} -m pip --python {py} install -q --disable-pip-version-check --no-deps --no-compile "
              f"--only-binary=:all: onnxruntime=={version} {_numpy_for(version)}")
    proc = subprocess.Popen(["bash", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return py, proc


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    """{version: runner output}, and the cases folder."""
    from dcnkit.runtime.ort import ort_library

    library = ort_library()
    base = tmp_path_factory.mktemp("ort_versions")
    t0 = time.monotonic()
    venvs = {v: _start_venv(base, v) for v in VERSIONS + [BELOW_FLOOR]}
    import ort_matrix_cases

    cases_dir = base / "cases"
    cases_dir.mkdir()
    cases = ort_matrix_cases.build_cases(cases_dir)
    t_cases = time.monotonic() - t0
    failed = {}
    for v, (_, proc) in venvs.items():
        out, _ = proc.communicate(timeout=600)
        if proc.returncode != 0:
            failed[v] = out[-2000:]
    assert not failed, f"venvs could not be made: {failed}"
    t_venvs = time.monotonic() - t0
    runs = {}
    for v, (py, _) in venvs.items():
        only = [cases[0]["name"]] if v == BELOW_FLOOR else []
        runs[v] = subprocess.Popen([str(py), str(RUNNER), str(cases_dir), library, *only], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=base)
    results = {}
    for v, proc in runs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"onnxruntime {v}: the runner failed:\n{err[-3000:]}"
        results[v] = json.loads(out.strip().splitlines()[-1])
    print(f"\nversion matrix: cases {t_cases:.0f} s, venvs ready at {t_venvs:.0f} s, "
          f"runs done at {time.monotonic() - t0:.0f} s")
    return {"results": results, "cases": cases, "dir": cases_dir, "venvs": {v: py for v, (py, _) in venvs.items()}}


def _table(results: dict) -> str:
    names = list(next(iter(results.values()))["results"])
    lines = ["case".ljust(30) + " ".join(v.rjust(7) for v in results)]
    for n in names:
        lines.append(n.ljust(30) + " ".join(r["results"].get(n, {}).get("status", "-").rjust(7)
                                            for r in results.values()))
    return "\n".join(lines)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_case_runs_and_matches_eager(matrix, version):
    got = matrix["results"][version]
    assert got["onnxruntime"] == version
    wrong = {}
    for case in matrix["cases"]:
        r = got["results"][case["name"]]
        if "error_before" in case and _key(version) < tuple(case["error_before"]):
            if r["status"] != "error" or case["error"] not in r["message"]:  # the library's kernel, which refuses
                wrong[case["name"]] = r
        elif r["status"] != "ok":
            wrong[case["name"]] = r
    if version == NEWEST:
        print("\n" + _table({v: matrix["results"][v] for v in VERSIONS}))
    assert not wrong, f"onnxruntime {version}: {json.dumps(wrong, indent=1)}"
    assert len(got["results"]) == len(matrix["cases"]) >= 20


def test_a_release_below_the_floor_is_refused_in_one_line(matrix):
    got = matrix["results"][BELOW_FLOOR]
    assert got["onnxruntime"] == BELOW_FLOOR
    (r,) = got["results"].values()
    assert r["status"] == "error" and REFUSAL in r["message"], r


# ---- the C++ runner against the oldest and the newest release ----------------------------------------------------


def _tool(name):
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _libonnxruntime(version: str, matrix, base: Path) -> Path:
    """The release's libonnxruntime.so.1.x.y: in its wheel from 1.19 on, else from npm's onnxruntime-node."""
    site = matrix["venvs"][version].parents[1] / "lib"
    hits = sorted(site.glob(f"python3*/site-packages/onnxruntime/capi/libonnxruntime.so.{version}"))
    if hits:
        return hits[0]
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(f"libonnxruntime.so.{version} is not in its wheel and npm (onnxruntime-node) is not here")
    p = subprocess.run([npm, "pack", "--silent", f"onnxruntime-node@{version}"], cwd=base, capture_output=True,
                       text=True, timeout=600)
    if p.returncode != 0:
        pytest.skip(f"npm pack onnxruntime-node@{version} failed: {p.stderr[-500:]}")
    member = f"package/bin/napi-v3/linux/x64/libonnxruntime.so.{version}"
    with tarfile.open(base / p.stdout.strip().splitlines()[-1]) as tar:
        tar.extract(member, base, filter="data")
    return base / member


@pytest.mark.parametrize("version", [OLDEST, NEWEST])
def test_cpp_runner_builds_and_runs_against_the_release(matrix, version, tmp_path):
    cmake = _tool("cmake")
    if cmake is None or shutil.which("g++") is None:
        pytest.skip("cmake / g++ not found")
    from dcnkit.runtime.ort import ort_library

    lib = _libonnxruntime(version, matrix, tmp_path)
    build = tmp_path / "build"
    cmd = [cmake, "-S", str(ROOT / "runtime" / "cpp"), "-B", str(build), f"-DONNXRUNTIME_LIBRARY={lib}"]
    if _tool("ninja"):
        cmd += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={_tool('ninja')}"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    subprocess.run([cmake, "--build", str(build)], check=True, capture_output=True, text=True)
    cases = {c["name"]: c for c in matrix["cases"]}
    for name in ("model_dcn_resnet", "kit_deform_conv2d", "std_deform_conv"):
        case, out = cases[name], tmp_path / name
        out.mkdir()
        args = [str(build / "dcnkit_ort_run"), "--model", str(matrix["dir"] / case["file"]), "--library",
                ort_library(), "--output-dir", str(out)]
        with np.load(matrix["dir"] / case["inputs"]) as z:
            for k in z.files:
                np.save(out / f"in_{k}.npy", z[k])
                args += ["--input", f"{k}={out / f'in_{k}.npy'}"]
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        p = subprocess.run(args, capture_output=True, text=True, env=env)
        assert p.returncode == 0, f"{name} on {version}: {p.stderr}"
        with np.load(matrix["dir"] / case["want"]) as want:
            outs = sorted(out.glob("*.npy"))
            got = [np.load(f) for f in outs if not f.name.startswith("in_")]
            assert len(got) == len(want.files) == 1
            np.testing.assert_allclose(got[0], want["output_0"], rtol=1e-4, atol=1e-5, err_msg=f"{name} {version}")


# ---- Triton: the repository triton-repo writes for a standard-DeformConv file, as Triton's onnxruntime backend of an
# ---- old container (ONNX Runtime 1.16) would load it

_BACKEND_LIKE = """
import sys, numpy as np, onnxruntime as ort
so = ort.SessionOptions()
so.register_custom_ops_library(sys.argv[1])  # model_operations.op_library_filename, mapped to this machine
sess = ort.InferenceSession(sys.argv[2], so, providers=["CPUExecutionProvider"])
z = np.load(sys.argv[3])
np.save(sys.argv[4], sess.run(None, {k: z[k] for k in z.files})[0])
"""


def test_triton_repository_of_a_standard_file_runs_in_the_oldest_release(matrix, tmp_path):
    from dcnkit.runtime import triton

    case = next(c for c in matrix["cases"] if c["name"] == "std_deform_conv")
    d = triton.write_repository(matrix["dir"] / case["file"], tmp_path / "repo", name="dcn", max_batch_size=0,
                                container_repository="/models")
    (lib,) = triton.parse_config((d / "config.pbtxt").read_text()).model_operations.op_library_filename
    assert lib == "/models/dcn/libdcnkit_ort.so"
    local = tmp_path / "repo" / Path(lib).relative_to("/models")
    out = tmp_path / "out.npy"
    p = subprocess.run([str(matrix["venvs"][OLDEST]), "-c", _BACKEND_LIKE, str(local), str(d / "1" / "model.onnx"),
                        str(matrix["dir"] / case["inputs"]), str(out)], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    with np.load(matrix["dir"] / case["want"]) as want:
        np.testing.assert_allclose(np.load(out), want["output_0"], rtol=1e-4, atol=1e-5)
