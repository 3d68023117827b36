"""The plugin library in every TensorRT from 10.0 to 11.x, without TensorRT: a host stand-in compiled against each
release's public headers (tests/cpp/tensorrt_lifecycle_test.cpp, with that release's ILoggerFinder, ILogger and
IPluginRegistry) loads the one library the build made as IPluginRegistry::loadLibrary does, creates every plugin
with good and bad fields, runs the host lifecycle harness and checks that every message reaches its logger; once
with a stand-in libnvinfer of that release loaded (tests/cpp/fake_nvinfer.cpp: its soname and getInferLibVersion)
and once bare (the library then tells the release by the finder's type). A TensorRT the library does not serve
(8.6, 12.0) gets one line on stderr, no creator and no call. The plugin sources compile against every release's
headers.

The releases' headers: TensorRT_RELEASE_HEADERS (colon-separated include folders; .ci/run sets it from the
`versions/<release>/include` folders beside TensorRT_INCLUDE_DIR)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dcnkit

ROOT = Path(__file__).resolve().parents[1]
CPP = ROOT / "tests" / "cpp"
CUDA_INC = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"


def _release(inc: Path) -> str:
    text = (inc / "NvInferVersion.h").read_text()
    return ".".join(re.search(rf"#define (?:TRT_{p}_ENTERPRISE|NV_TENSORRT_{p}) (\d+)", text).group(1)
                    for p in ("MAJOR", "MINOR", "PATCH"))


def _releases() -> dict[str, Path]:
    dirs = [Path(d) for d in os.environ.get("TensorRT_RELEASE_HEADERS", "").split(":") if d]
    return {_release(d): d for d in dirs if (d / "NvInferRuntime.h").is_file()}


def _library() -> Path | None:
    try:
        return Path(dcnkit.tensorrt_library())
    except (FileNotFoundError, ValueError):
        return None


RELEASES = _releases()
CXX = shutil.which("g++") or shutil.which("c++")
pytestmark = pytest.mark.skipif(
    len(RELEASES) < 2 or _library() is None or CXX is None or not (CUDA_INC / "cuda_runtime_api.h").is_file(),
    reason="needs TensorRT_RELEASE_HEADERS (two or more releases' headers), the plugin library, g++ and CUDA headers")


def _compile(args: list[str]) -> None:
    r = subprocess.run([CXX, "-std=c++17", "-O1", "-Wno-deprecated-declarations", *args], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Per release: (the host program, its stand-in libnvinfer) built against that release's headers."""
    tmp = tmp_path_factory.mktemp("releases")
    jobs = {}
    for rel, inc in RELEASES.items():
        major = rel.split(".")[0]
        exe, fake = tmp / f"host-{rel}", tmp / rel / f"libnvinfer.so.{major}"
        fake.parent.mkdir()
        flags = ["-isystem", str(inc), "-isystem", str(CUDA_INC)]
        jobs[(rel, "host")] = flags + ["-rdynamic", str(CPP / "tensorrt_lifecycle_test.cpp"), "-ldl", "-o", str(exe)]
        jobs[(rel, "fake")] = flags + ["-shared", "-fPIC", f"-Wl,-soname,libnvinfer.so.{major}",
                                       str(CPP / "fake_nvinfer.cpp"), "-ldl", "-o", str(fake)]
    # Releases the library does not serve: 8.6.1 (no IPluginV3) and a 12.0 to come, by soname and version.
    newest, oldest = RELEASES[max(RELEASES, key=_key)], RELEASES[min(RELEASES, key=_key)]
    for rel, inc, version in (("8.6.1", oldest, 8601), ("12.0.0", newest, 120000)):
        (tmp / rel).mkdir()
        jobs[(rel, "fake")] = ["-isystem", str(inc), "-isystem", str(CUDA_INC), "-shared", "-fPIC",
                               f"-Wl,-soname,libnvinfer.so.{rel.split('.')[0]}",
                               f"-DDCNKIT_FAKE_INFER_VERSION={version}", str(CPP / "fake_nvinfer.cpp"), "-ldl", "-o",
                               str(tmp / rel / f"libnvinfer.so.{rel.split('.')[0]}")]
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(_compile, jobs.values()))
    return {rel: (tmp / f"host-{rel}", next((tmp / rel).glob("libnvinfer.so.*"))) for rel in list(RELEASES) +
            ["8.6.1", "12.0.0"]}


def _key(rel: str):
    return tuple(int(x) for x in rel.split("."))


def _run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300, **kw)


@pytest.mark.parametrize("rel", sorted(RELEASES, key=_key))
def test_every_release_loads_the_library_and_gets_its_log_lines(hosts, rel):
    exe, fake = hosts[rel]
    lib = _library()
    for how, extra in (("stand-in libnvinfer loaded", ["--nvinfer", fake]), ("bare host", [])):
        r = _run([exe, lib, *extra])
        last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
        assert r.returncode == 0 and last.endswith(" 0 failed"), f"TensorRT {rel}, {how}:\n{r.stdout[-3000:]}{r.stderr}"
        assert int(last.split()[0]) > 2000, last  # every creator's checks ran, bad fields reaching the logger included
        assert "dcnkit:" not in r.stderr, r.stderr  # every message went to the host's logger, none to stderr


@pytest.mark.parametrize("rel", ["8.6.1", "12.0.0"])
def test_a_release_the_library_does_not_serve_is_refused_in_one_line(hosts, rel):
    exe = hosts[min(RELEASES, key=_key) if rel.startswith("8") else max(RELEASES, key=_key)][0]
    fake = hosts[rel][1]
    r = _run([exe, _library(), "--expect-refusal"], env=dict(os.environ, LD_PRELOAD=str(fake)))
    assert r.returncode == 0 and r.stdout.strip().endswith("0 failed"), r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("dcnkit:")]
    shown = rel if rel.startswith("8") else "12.x"
    assert lines == [f"dcnkit: libdcnkit_trt.so serves TensorRT 10.x and 11.x; this process runs TensorRT {shown}: "
                     "getCreators offers no plugin creator"], r.stderr


@pytest.mark.parametrize("rel", sorted(RELEASES, key=_key))
def test_the_autoreg_library_registers_into_every_release(hosts, rel):
    """libdcnkit_trt_autoreg.so finds libnvinfer.so.10 or .11 and registers through that release's registry ABI,
    logging through its getLogger."""
    fake = hosts[rel][1]
    autoreg = _library().with_name("libdcnkit_trt_autoreg.so")
    r = _run([sys.executable, "-c", f"""
import ctypes, os
fake = ctypes.CDLL({str(fake)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
fake.fake_registered_keys.restype = ctypes.c_char_p
ctypes.CDLL({str(autoreg)!r}, mode=os.RTLD_NOW | os.RTLD_LOCAL)
print(";".join(sorted(k for k in fake.fake_registered_keys().decode().split(";") if k)))
"""])
    assert r.returncode == 0, r.stdout + r.stderr
    keys = r.stdout.strip().splitlines()[-1].split(";")
    assert "dcnkit::DeformConv2d" in keys and "::MMCVModulatedDeformConv2d" in keys
    assert f"[fake nvinfer] dcnkit: registered {len(keys)} of {len(keys)} plugin creators" in r.stderr, r.stderr


def _cublas_include() -> list[str]:
    """cuBLAS's headers (the toolkit's, else a pip nvidia package's), as the build finds them."""
    found = [CUDA_INC] + [Path(p).parent for s in sys.path if s for p in Path(s).glob("nvidia/*/include/cublas_v2.h")]
    return next((["-isystem", str(d)] for d in found if (d / "cublas_v2.h").is_file()), [])


def _plugin_sources():
    return sorted(p for p in (ROOT / "plugins" / "tensorrt").glob("*.cpp") if p.name != "trt_autoreg.cpp")


@pytest.mark.parametrize("rel", sorted(RELEASES, key=_key))
def test_the_plugin_sources_compile_against_every_release(rel):
    inc = RELEASES[rel]
    major = rel.split(".")[0]
    common = ["-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-Wno-deprecated-declarations", "-isystem", str(inc),
              "-isystem", str(CUDA_INC), "-I", str(ROOT / "plugins" / "core" / "include"),
              "-I", str(ROOT / "plugins" / "tensorrt"), *_cublas_include()]
    jobs = []
    for src in _plugin_sources() + [ROOT / "plugins" / "tensorrt" / "trt_autoreg.cpp"]:
        extra = [f"-DDCNKIT_TRT_ABI={major}", f"-Dnvinfer1=dcnkit_nvinfer1_v{major}"] if src.name == "trt_abi_shim.cpp" \
            else [f"-DDCNKIT_TRT_ABI{major}"]
        jobs.append(common + extra + [str(src)])
    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(_compile, jobs))
