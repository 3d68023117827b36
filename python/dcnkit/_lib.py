"""Locating dcnkit's native libraries (installed under ``dcnkit/lib`` by the build)."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

_LIB_DIR_ENV = "DCNKIT_LIB_DIR"


def _candidate_dirs() -> list[Path]:
    dirs = []
    if os.environ.get(_LIB_DIR_ENV):
        dirs.append(Path(os.environ[_LIB_DIR_ENV]))
    dirs.append(Path(__file__).resolve().parent / "lib")
    # Editable installs keep the Python sources in the repository and the built libraries in
    # site-packages: ask the installed distribution where its files are.
    try:
        from importlib import metadata

        dist = metadata.distribution("dcnkit")
        for f in dist.files or []:
            if f.parent.name == "lib" and f.parent.parent.name == "dcnkit":
                dirs.append(Path(f.locate()).resolve().parent)
                break
    except Exception:  # pragma: no cover - not installed as a distribution
        pass
    return dirs


def find_library(stem: str) -> Path:
    """Absolute path of ``lib<stem>.so``; raises FileNotFoundError with the places searched."""
    name = f"lib{stem}.so"
    searched = []
    for d in _candidate_dirs():
        p = d / name
        searched.append(str(p))
        if p.is_file():
            return p.resolve()
    raise FileNotFoundError(
        f"dcnkit: native library {name} not found (searched: {', '.join(searched)}). "
        "Build dcnkit first: bash scripts/setup.sh"
    )


# Every native library a build can hold (which ones a wheel has depends on the toolkits of the machine that built it).
NATIVE_LIBRARIES = ("dcnkit_torch", "dcnkit_ort", "dcnkit_ort_cuda", "dcnkit_trt", "dcnkit_trt_autoreg", "dcnkit_ov")


def native_libraries() -> dict[str, Path | None]:
    """``lib<stem>.so`` -> its path, or None where this installation does not hold it."""
    out = {}
    for stem in NATIVE_LIBRARIES:
        try:
            out[f"lib{stem}.so"] = find_library(stem)
        except FileNotFoundError:
            out[f"lib{stem}.so"] = None
    return out


@functools.lru_cache(maxsize=None)
def _table_library():
    """A native library with the op table, loaded once: the PyTorch one where torch is imported (it is loaded there
    anyway; the ONNX Runtime library would bring OpenBLAS and its threads into a training process), else the ONNX
    Runtime one (a deployment without torch), else the other."""
    import ctypes
    import sys

    stems = ("dcnkit_torch", "dcnkit_ort") if "torch" in sys.modules else ("dcnkit_ort", "dcnkit_torch")
    for stem in stems:
        try:
            path = find_library(stem)
        except FileNotFoundError:
            continue
        try:
            return ctypes.CDLL(str(path), mode=getattr(os, "RTLD_LAZY", 1) | ctypes.RTLD_LOCAL)
        except OSError:
            continue
    raise FileNotFoundError("dcnkit: no native library with the operator definitions was found")


@functools.lru_cache(maxsize=None)
def op_defs() -> dict:
    """The operator definitions (input order, attribute names, defaults, other tools' names) from the C++ core."""
    import ctypes

    fn = _table_library().dcnkit_op_defs_json
    fn.restype = ctypes.c_char_p
    return json.loads(fn().decode())


def op_output_dims(op_type: str, attrs: list, inputs: list, variadic: list) -> list | None:
    """An op's output dims from its declaration (ONNX shape inference of the kit's nodes).

    ``attrs``: the canonical attribute values in the table's order; ``inputs``: per canonical input None or its dims;
    ``variadic``: the dims of each tensor of a variadic last input. A dim is an int, a name or None. Returns one dims
    list per output (None: the op declares no rule), or raises ValueError with the core's message.

    With ``op_type`` ``"<domain>::<op type>"`` (any name of an op, as a model writes it): ``attrs`` the node's
    attributes as ``[name, kind, value]`` (kind ``"int"``, ``"float"``, ``"string"``, ``"ints"``, ``"floats"``),
    ``inputs`` its inputs' dims in node order, ``variadic`` empty.
    """
    return _op_infer(op_type, attrs, inputs, variadic)["outputs"]


def op_node(op_type: str, attrs: list, inputs: list) -> dict:
    """A node of a name of an op (``"<domain>::<op type>"``, ``attrs`` as ``[name, kind, value]`` triples, ``inputs``
    its inputs' dims in node order, as :func:`op_output_dims` takes them) read and checked as every backend does:
    ``{"attrs": {canonical name: value}, "outputs": [dims...]}``; ValueError with the core's message."""
    return _op_infer(op_type, attrs, inputs, [])


def _op_infer(op_type: str, attrs: list, inputs: list, variadic: list) -> dict:
    import ctypes

    fn = _table_library().dcnkit_op_infer
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]
    fn.restype = ctypes.c_int
    request = json.dumps([attrs, inputs, variadic]).encode()
    size = 4096
    while True:
        buf = ctypes.create_string_buffer(size)
        n = fn(op_type.encode(), request, buf, size)
        if n < size:
            break
        size = n + 1
    answer = json.loads(buf.value.decode())
    if "error" in answer:
        raise ValueError(answer["error"])
    return answer
