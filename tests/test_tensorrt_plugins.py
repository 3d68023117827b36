"""The TensorRT plugin library, without TensorRT or a GPU: built whenever TensorRT's headers and nvcc are there,
links nothing from TensorRT, and every creator passes the host-side lifecycle test (tests/cpp)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dcnkit

ROOT = Path(__file__).resolve().parents[1]
LIFECYCLE_SRC = ROOT / "tests" / "cpp" / "tensorrt_lifecycle_test.cpp"


def _trt_include():
    """TensorRT headers as the build finds them (TensorRT_INCLUDE_DIR / TensorRT_ROOT, then usual places)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from check_trt_enqueue import trt_include
    finally:
        sys.path.pop(0)
    return trt_include()


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


@pytest.fixture
def lib():
    """The built plugin library (the test skips without one)."""
    path = _library()
    if path is None:
        pytest.skip("no library")
    return path


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
    assert text_symbols == ["dcnkit_op_defs_json", "dcnkit_trt_register_creators", "getCreators", "setLoggerFinder"]
    for path in (lib, lib.with_name("libdcnkit_trt_autoreg.so")):
        assert path.is_file(), f"{path.name} is installed beside libdcnkit_trt.so"
        undefined = subprocess.run(["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True,
                                   check=True)
        assert "nvinfer" not in undefined.stdout.lower()
        needed = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
        assert "libnvinfer" not in needed
    autoreg = subprocess.run(["nm", "-D", "--defined-only", str(lib.with_name("libdcnkit_trt_autoreg.so"))],
                             capture_output=True, text=True, check=True)
    assert not [line for line in autoreg.stdout.splitlines() if " T " in line]  # loading it is its interface


@needs_headers
@needs_nvcc
def test_op_table_is_the_one_of_the_other_libraries(lib):
    import ctypes
    import json

    handle = ctypes.CDLL(str(lib))
    handle.dcnkit_op_defs_json.restype = ctypes.c_char_p
    assert json.loads(handle.dcnkit_op_defs_json()) == dcnkit.op_defs()


def _major():
    import re

    header = (_trt_include() / "NvInferVersion.h").read_text()
    return int(re.search(r"#define (?:TRT_MAJOR_ENTERPRISE|NV_TENSORRT_MAJOR) (\d+)", header).group(1))


@pytest.fixture(scope="module")
def lifecycle(tmp_path_factory):
    """The lifecycle test program, compiled against the TensorRT headers alone, the library, and a stand-in
    libnvinfer (tests/cpp/fake_nvinfer.cpp, with the real one's soname)."""
    lib = _library()
    cuda_inc = _cuda_include()
    cxx = shutil.which("g++") or shutil.which("c++")
    if _trt_include() is None or _nvcc() is None or lib is None or cuda_inc is None or cxx is None:
        pytest.skip("needs TensorRT headers, the library, CUDA headers and a C++ compiler")
    tmp = tmp_path_factory.mktemp("trt")
    exe = tmp / "tensorrt_lifecycle_test"
    build = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-Wall", "-Wno-deprecated-declarations", "-isystem", str(_trt_include()),
         "-isystem", str(cuda_inc), "-rdynamic", str(LIFECYCLE_SRC), "-ldl", "-o", str(exe)],
        capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    major = _major()
    fake = tmp / f"libnvinfer.so.{major}"
    build = subprocess.run(
        [cxx, "-std=c++17", "-shared", "-fPIC", "-O1", "-Wno-deprecated-declarations", "-isystem", str(_trt_include()),
         "-isystem", str(cuda_inc), f"-Wl,-soname,libnvinfer.so.{major}", str(LIFECYCLE_SRC.parent / "fake_nvinfer.cpp"),
         "-ldl", "-o", str(fake)], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return exe, lib, fake


def test_every_creator_through_the_plugin_lifecycle(lifecycle):
    """Per creator: fields, shapes, formats, serialization, clone, bad input; then loadLibrary-style loading through
    a registry that fails on re-entry, workspace bounds from inconsistent profile maxima and enqueue's workspace
    checks, float32 RoIs with 16-bit features in every RoI plugin, one cuBLAS handle per execution context, and
    timing-cache IDs (tests/cpp/tensorrt_runtime_checks.h)."""
    exe, lib, fake = lifecycle
    run = subprocess.run([str(exe), str(lib), "--nvinfer", str(fake)], capture_output=True, text=True, timeout=120)
    last = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else ""
    assert run.returncode == 0 and last.endswith(" 0 failed"), run.stdout + run.stderr
    passed = int(last.split()[0])
    assert passed > 500, last  # every creator ran its checks


# PluginFieldType values (NvInferPluginBase.h) and the ONNX attribute kinds the parser maps onto them.
_FIELD_KINDS = {1: {"FLOAT", "FLOATS"}, 5: {"INT", "INTS"}, 6: {"STRING"}}


def _creators(exe, lib, _fake=None):
    out = subprocess.run([str(exe), str(lib), "--list"], capture_output=True, text=True, check=True).stdout
    creators = {}
    for line in filter(None, out.splitlines()):  # a creator without fields ends its line with a tab
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
    from test_export import OP_MODELS, Dcnv3Ops, MsdaOps

    creators = _creators(*lifecycle)
    assert len(creators) >= 8
    seen = set()
    extra = [("msda", MsdaOps), ("dcnv3", Dcnv3Ops)]
    for op_name, cls in [(name, c) for name, (c, _, _) in OP_MODELS.items()] + extra:
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
    assert seen == _ops_with_plugins()


def test_documented_foreign_names_are_the_creators(lifecycle):
    """docs/tensorrt.md's hand-written tables (scripts/gen_tensorrt_fields.py): every mmdeploy / InternImage name is a
    creator in namespace "" with exactly those fields and types; TensorRT's own names are not in getCreators."""
    import sys

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gen_tensorrt_fields as gen
    finally:
        sys.path.pop(0)
    creators = _creators(*lifecycle)
    kinds = {"int": 5, "ints": 5, "float": 1, "floats": 1, "string": 6}
    for name, _, fields in gen.MMDEPLOY:
        assert (name, "1", "") in creators, name
        assert {f: kinds[k] for f, k, _ in fields} == {f: t for f, (t, _) in creators[(name, "1", "")].items()}, name
    for name, _, _ in gen.TENSORRT_NAMES:
        assert not [k for k in creators if k[0] == name], name


def _ops_with_plugins() -> set:
    return {d["onnx_type"] for d in dcnkit.op_defs()["ops"]}


def _python(code):
    import sys

    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


_KEYS = """
fake.fake_registered_keys.restype = ctypes.c_char_p
def keys():
    return sorted(k for k in fake.fake_registered_keys().decode().split(";") if k)
"""


def test_loading_the_plugin_library_registers_nothing_by_itself(lifecycle):
    """libdcnkit_trt.so dlopen'ed into a process that has TensorRT (here the stand-in) calls no registry: neither
    its loading nor getCreators (IPluginRegistry::loadLibrary registers what getCreators returns)."""
    _, lib, fake = lifecycle
    r = _python(f"""
import ctypes, os
fake = ctypes.CDLL({str(fake)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
{_KEYS}
lib = ctypes.CDLL({str(lib)!r}, mode=os.RTLD_NOW | os.RTLD_LOCAL)
n = ctypes.c_int32(0)
lib.getCreators.restype = ctypes.c_void_p
lib.getCreators(ctypes.byref(n))
print(n.value, keys(), fake.fake_registry_calls())
""")
    assert r.returncode == 0, r.stdout + r.stderr
    count, rest = r.stdout.strip().split(" ", 1)
    assert int(count) >= 10 and rest == "[] 0", r.stdout


def test_the_autoreg_library_registers_the_creators_for_dlopen_only_loaders(lifecycle):
    """Triton's plugins=, Polygraphy's --plugins and LD_PRELOAD only dlopen: libdcnkit_trt_autoreg.so, loaded after
    TensorRT, registers every creator of libdcnkit_trt.so (beside it) through dcnkit_trt_register_creators, and
    says so through libnvinfer's logger."""
    _, lib, fake = lifecycle
    autoreg = lib.with_name("libdcnkit_trt_autoreg.so")
    r = _python(f"""
import ctypes, os
fake = ctypes.CDLL({str(fake)!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)
{_KEYS}
ctypes.CDLL({str(autoreg)!r}, mode=os.RTLD_NOW | os.RTLD_LOCAL)
print(";".join(keys()))
""")
    assert r.returncode == 0, r.stdout + r.stderr
    keys = set(r.stdout.strip().splitlines()[-1].split(";"))
    assert {f"dcnkit::{t}" for t in _ops_with_plugins()} <= keys
    assert {"::MMCVModulatedDeformConv2d", "::MMCVDeformConv2d", "::MMCVRoiAlign", "::MMCVMultiLevelRoiAlign",
            "::MMCVDeformRoIPool", "::MMCVMultiScaleDeformableAttention", "::TRTDCNv3"} <= keys
    # TensorRT's own plugin name, which getCreators leaves out (loadLibrary would fail where TensorRT registered it)
    assert "::MultiscaleDeformableAttnPlugin_TRT" in keys
    assert f"[fake nvinfer] dcnkit: registered {len(keys)} of {len(keys)} plugin creators" in r.stderr, r.stderr


def test_the_autoreg_library_without_tensorrt_registers_nothing_and_says_why(lifecycle):
    _, lib, _ = lifecycle
    r = _python(f"""
import ctypes, os
ctypes.CDLL({str(lib.with_name("libdcnkit_trt_autoreg.so"))!r}, mode=os.RTLD_NOW | os.RTLD_LOCAL)
print("loaded")
""")
    assert r.returncode == 0 and r.stdout.strip() == "loaded", r.stdout + r.stderr
    assert "neither libnvinfer.so.10 nor libnvinfer.so.11 is loaded in this process" in r.stderr, r.stderr


class _Registry:
    """A stand-in for TensorRT's Python plugin registry: load_library answers ``handle``; get_creator finds
    DeformConv2d when ``registered``."""

    def __init__(self, handle, registered=False):
        self.handle, self.registered, self.loaded = handle, registered, []

    def load_library(self, path):
        self.loaded.append(path)
        return self.handle

    def get_creator(self, name, version, namespace):
        return object() if self.registered and (name, version, namespace) == ("DeformConv2d", "1", "dcnkit") else None


def _load_plugins_with(monkeypatch, registry, dlopened, version=None):
    """dcnkit.runtime.tensorrt.load_plugins against a stand-in ``tensorrt`` module and Polygraphy's LoadPlugins
    recording what it would dlopen."""
    import sys
    import types

    from polygraphy.backend import trt as poly_trt
    from polygraphy.backend.trt import util as poly_util

    from dcnkit.runtime import tensorrt as dk_trt

    fake = types.ModuleType("tensorrt")
    if version is not None:
        fake.__version__ = version
    fake.init_libnvinfer_plugins = lambda logger, ns: True
    fake.get_plugin_registry = lambda: registry
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    monkeypatch.setattr(dk_trt, "require_tensorrt", lambda: None)
    monkeypatch.setattr(dk_trt, "_LOADED", {})
    monkeypatch.setattr(poly_util, "get_trt_logger", lambda: None)

    class LoadPlugins:
        def __init__(self, plugins):
            self.plugins = plugins

        def __call__(self):
            dlopened.extend(self.plugins)
            registry.registered = True  # what libdcnkit_trt_autoreg.so does in a process with TensorRT

    monkeypatch.setattr(poly_trt, "LoadPlugins", LoadPlugins)
    lines = []
    dk_trt.load_plugins(log=lines.append)
    return lines


@needs_headers
@needs_nvcc
def test_the_kits_tools_load_the_library_with_load_library_first(monkeypatch, lib):
    registry, dlopened = _Registry(handle=object()), []
    lines = _load_plugins_with(monkeypatch, registry, dlopened)
    assert registry.loaded == [str(lib.resolve())] and dlopened == []
    assert lines == [f"plugins: {lib.resolve()} (IPluginRegistry.load_library)"]


@needs_headers
@needs_nvcc
def test_the_kits_tools_fall_back_to_the_autoreg_library(monkeypatch, lib):
    registry, dlopened = _Registry(handle=None), []
    lines = _load_plugins_with(monkeypatch, registry, dlopened)
    assert registry.loaded == [str(lib.resolve())]
    assert dlopened == [str(lib.with_name("libdcnkit_trt_autoreg.so"))]
    assert "libdcnkit_trt_autoreg.so (IPluginRegistry.load_library failed)" in lines[0]


@needs_headers
@needs_nvcc
def test_tensorrt_library_names_the_library_of_a_release_or_refuses_it(monkeypatch, lib):
    import types

    served = dcnkit.tensorrt_releases_served()
    assert _major() in served  # the headers of the build serve their own major
    for v in [f"{m}.{minor}" for m in served for minor in (0, 3, 16)] + [f"{served[-1]}.1.0"]:
        assert Path(dcnkit.tensorrt_library(v)) == lib
    for v, why in (("8.6", "TensorRT 8.x and 9.x have no IPluginV3"), ("9.0", "no IPluginV3"), ("12.0", "serves")):
        with pytest.raises(ValueError, match=rf"TensorRT {v} is not served.*serves TensorRT {served[0]}\.x"):
            dcnkit.tensorrt_library(v)
    with pytest.raises(ValueError, match="version: expected a TensorRT release such as '10.3'"):
        dcnkit.tensorrt_library("latest")
    # None: the installed tensorrt module's release (a stand-in module here)
    monkeypatch.setitem(sys.modules, "tensorrt", types.SimpleNamespace(__version__="8.6.1"))
    with pytest.raises(ValueError, match="TensorRT 8.6.1 is not served"):
        dcnkit.tensorrt_library()


@needs_headers
@needs_nvcc
def test_the_kits_tools_refuse_a_tensorrt_the_library_does_not_serve(monkeypatch, lib):
    registry, dlopened = _Registry(handle=object()), []
    with pytest.raises(ValueError, match="TensorRT 8.6.1 is not served"):
        _load_plugins_with(monkeypatch, registry, dlopened, version="8.6.1")
    assert registry.loaded == [] and dlopened == []  # nothing was loaded
