"""The TensorRT plugin library, without TensorRT or a GPU: built whenever TensorRT's headers and nvcc are there,
links nothing from TensorRT, and every creator passes the host-side lifecycle test (tests/cpp)."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import dcnkit

ROOT = Path(__file__).resolve().parents[1]
LIFECYCLE_SRC = ROOT / "tests" / "cpp" / "tensorrt_lifecycle_test.cpp"


def _trt_include():
    """TensorRT headers as the build finds them (TensorRT_INCLUDE_DIR / TensorRT_ROOT, then usual places)."""
    cands = [os.environ.get("TensorRT_INCLUDE_DIR", "")]
    if os.environ.get("TensorRT_ROOT"):
        cands.append(os.path.join(os.environ["TensorRT_ROOT"], "include"))
    cands += ["/usr/include/x86_64-linux-gnu", "/usr/local/TensorRT/include", "/opt/tensorrt/include", "/usr/include"]
    for c in cands:
        if c and (Path(c) / "NvInferRuntime.h").is_file():
            return Path(c)
    return None


def _cuda_include():
    home = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    return home / "include" if (home / "include" / "cuda_runtime_api.h").is_file() else None


def _nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    p = Path(home) / "bin" / "nvcc"
    return str(p) if p.is_file() else shutil.which("nvcc")


needs_headers = pytest.mark.skipif(_trt_include() is None, reason="no TensorRT headers (set TensorRT_INCLUDE_DIR)")
needs_nvcc = pytest.mark.skipif(_nvcc() is None, reason="no nvcc: the plugin library needs the CUDA kernels")


def _library():
    try:
        return dcnkit.find_library("dcnkit_trt")
    except FileNotFoundError:
        return None


@needs_headers
@needs_nvcc
def test_library_is_built_when_headers_are_given():
    lib = _library()
    assert lib is not None, (
        f"TensorRT headers are at {_trt_include()} and nvcc is present, but libdcnkit_trt.so was not built")


@needs_headers
@needs_nvcc
def test_library_exports_only_the_plugin_entry_points_and_needs_no_tensorrt():
    lib = _library()
    if lib is None or shutil.which("nm") is None:
        pytest.skip("no library or no nm")
    defined = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True)
    text_symbols = sorted(line.split()[-1] for line in defined.stdout.splitlines() if " T " in line)
    assert text_symbols == ["dcnkit_op_defs_json", "getCreators", "setLoggerFinder"]
    undefined = subprocess.run(["nm", "-D", "--undefined-only", str(lib)], capture_output=True, text=True, check=True)
    assert "nvinfer" not in undefined.stdout.lower()
    needed = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "libnvinfer" not in needed


@needs_headers
@needs_nvcc
def test_op_table_is_the_one_of_the_other_libraries():
    import ctypes
    import json

    lib = _library()
    if lib is None:
        pytest.skip("no library")
    handle = ctypes.CDLL(str(lib))
    handle.dcnkit_op_defs_json.restype = ctypes.c_char_p
    assert json.loads(handle.dcnkit_op_defs_json()) == dcnkit.op_defs()


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory):
    """The lifecycle test program, compiled against the TensorRT headers alone, and the library."""
    lib = _library()
    cuda_inc = _cuda_include()
    cxx = shutil.which("g++") or shutil.which("c++")
    if _trt_include() is None or _nvcc() is None or lib is None or cuda_inc is None or cxx is None:
        pytest.skip("needs TensorRT headers, the library, CUDA headers and a C++ compiler")
    exe = tmp_path_factory.mktemp("trt") / "tensorrt_lifecycle_test"
    build = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-Wall", "-Wno-deprecated-declarations", "-isystem", str(_trt_include()),
         "-isystem", str(cuda_inc), str(LIFECYCLE_SRC), "-ldl", "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe, lib


def test_every_creator_through_the_plugin_lifecycle(lifecycle):
    exe, lib = lifecycle
    run = subprocess.run([str(exe), str(lib)], capture_output=True, text=True, timeout=120)
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and last.endswith(" 0 failed"), run.stdout + run.stderr
    passed = int(last.split()[0])
    assert passed > 500, last  # every creator ran its checks


# PluginFieldType values (NvInferPluginBase.h) and the ONNX attribute kinds the parser maps onto them.
_FIELD_KINDS = {1: {"FLOAT", "FLOATS"}, 5: {"INT", "INTS"}, 6: {"STRING"}}


def _creators(exe, lib):
    out = subprocess.run([str(exe), str(lib), "--list"], capture_output=True, text=True, check=True).stdout
    creators = {}
    for line in out.strip().splitlines():
        name, version, ns, fields = (line.split("\t") + [""])[:4]
        creators[(name, version, ns)] = {
            f.split(":")[0]: (int(f.split(":")[1]), int(f.split(":")[2])) for f in fields.split(",") if f}
    return creators


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_exported_custom_nodes_address_a_creator_with_their_fields(lifecycle, tmp_path, dynamo):
    """What TensorRT's ONNX parser does with a dcnkit node: the plugin (op type, plugin_version or "1",
    plugin_namespace or "") must exist, every other attribute must be one of its fields with a kind the
    parser maps onto the field's type, and inputs are passed by position (none may be empty)."""
    import onnx
    import torch
    from test_export import OP_MODELS

    creators = _creators(*lifecycle)
    assert len(creators) >= 8
    seen = set()
    for op_name, (cls, _, _) in OP_MODELS.items():
        path = tmp_path / f"{op_name}.onnx"
        dcnkit.export.to_onnx(cls().eval(), cls.inputs(2, 3, torch.Generator().manual_seed(1)), path,
                              standard_ops=False, dynamo=dynamo)
        for node in onnx.load(str(path)).graph.node:
            if node.domain != "dcnkit":
                continue
            attrs = {a.name: a for a in node.attribute}
            version = onnx.helper.get_attribute_value(attrs["plugin_version"]).decode() if "plugin_version" in attrs else "1"
            ns = onnx.helper.get_attribute_value(attrs["plugin_namespace"]).decode() if "plugin_namespace" in attrs else ""
            key = (node.op_type, version, ns)
            assert key in creators, f"{key} names no creator of the library ({sorted(creators)})"
            fields = creators[key]
            for name, a in attrs.items():
                if name in ("plugin_version", "plugin_namespace"):
                    continue
                assert name in fields, f"{node.op_type}: attribute {name} is not a field {sorted(fields)}"
                kind = onnx.AttributeProto.AttributeType.Name(a.type)
                assert kind in _FIELD_KINDS[fields[name][0]], f"{node.op_type}.{name}: {kind} vs {fields[name]}"
                if kind == "INTS" and fields[name][1] > 0:
                    assert len(a.ints) == fields[name][1], f"{node.op_type}.{name}: {list(a.ints)}"
            assert all(node.input), f"{node.op_type}: an empty inner input"
            seen.add(node.op_type)
    assert seen == {d["onnx_type"] for d in dcnkit.op_defs()["ops"]}


def test_a_plain_dlopen_into_a_process_with_tensorrt_registers_the_creators(lifecycle, tmp_path):
    """Triton's plugins= option, LD_PRELOAD and Polygraphy's --plugins only dlopen the library: with TensorRT's
    libnvinfer (here a stand-in with its soname and a recording registry) already loaded, the library registers
    its creators itself, and getCreators (IPluginRegistry::loadLibrary) takes them back for TensorRT to register."""
    _, lib = lifecycle
    cxx = shutil.which("g++") or shutil.which("c++")
    import re

    header = (_trt_include() / "NvInferVersion.h").read_text()
    major = int(re.search(r"#define (?:TRT_MAJOR_ENTERPRISE|NV_TENSORRT_MAJOR) (\d+)", header).group(1))
    fake = tmp_path / f"libnvinfer.so.{major}"
    build = subprocess.run(
        [cxx, "-std=c++17", "-shared", "-fPIC", "-O1", "-Wno-deprecated-declarations", "-isystem", str(_trt_include()),
         "-isystem", str(_cuda_include()), f"-Wl,-soname,libnvinfer.so.{major}", str(LIFECYCLE_SRC.parent / "fake_nvinfer.cpp"),
         "-o", str(fake)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    script = f"""
import ctypes, os
lib = {str(lib)!r}
# Without TensorRT in the process nothing is registered (and nothing fails).
plain = ctypes.CDLL(lib, mode=os.RTLD_NOW | os.RTLD_LOCAL)
fake = ctypes.CDLL({str(fake)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
fake.fake_registered_keys.restype = ctypes.c_char_p
assert fake.fake_registered_keys() == b"", fake.fake_registered_keys()
"""
    # The library's static initialiser runs once per process: a second process loads it after the stand-in.
    script2 = f"""
import ctypes, os
fake = ctypes.CDLL({str(fake)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
fake.fake_registered_keys.restype = ctypes.c_char_p
lib = ctypes.CDLL({str(lib)!r}, mode=os.RTLD_NOW | os.RTLD_LOCAL)
keys = sorted(k for k in fake.fake_registered_keys().decode().split(";") if k)
print(";".join(keys))
n = ctypes.c_int32(0)
lib.getCreators.restype = ctypes.c_void_p
lib.getCreators(ctypes.byref(n))
print(n.value, fake.fake_registered_keys().decode() == "")
"""
    import sys

    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run([sys.executable, "-c", script2], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    keys_line, after = r.stdout.strip().splitlines()[-2:]
    keys = keys_line.split(";")
    ops = [d["onnx_type"] for d in dcnkit.op_defs()["ops"]]
    assert {f"dcnkit::{t}" for t in ops} <= set(keys)
    assert {"::MMCVModulatedDeformConv2d", "::MMCVDeformConv2d", "::MMCVRoiAlign", "::MMCVMultiLevelRoiAlign"} <= set(keys)
    count, emptied = after.split()
    assert int(count) == len(keys) and emptied == "True"  # getCreators took them back
