"""The checks of scripts/check_tensorrt.py that only a real TensorRT (and its tools) can answer, run first there.

Each check returns ``(name, result, detail)`` with result ``ok``, ``FAILED`` or ``skipped: <why>`` (a tool that is not
installed is a skip, not a failure):

- ``trtexec --dynamicPlugins``: trtexec builds an engine of a dynamic-shape model through libdcnkit_trt.so
  (IPluginRegistry::loadLibrary) and runs it; ``--useCudaGraph`` runs the same engine captured in a CUDA graph.
- ``serialize/deserialize``: every case's engine, built with a dynamic profile, deserializes and gets a context.
- ``compute-sanitizer``: every case run at its profile's min and max dims under ``compute-sanitizer --tool memcheck``.
- ``fp16 FPN RoI level``: MultiLevelRoIAlign with float16 maps and float32 RoIs whose level flips when the boxes are
  rounded to float16 matches the float32-RoI reference (the level the float32 boxes give).
- ``two contexts``: the second execution context of a DeformConv2d engine costs no more device memory than the first.
"""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto as T
from onnx import helper

FPN_STRIDES = (4.0, 8.0)
FPN_FINEST = 56


def fpn_boxes() -> np.ndarray:
    """Two square RoIs of side ~112.1 px at x, y ~1000..1112: level 1 in float32 (sqrt(area) / 56 >= 2), level 0
    once rounded to float16 (spacing 0.5 px below 1024 and 1 px above shrinks the side to 111.5)."""
    return np.array([[0, 1000.3, 1000.3, 1112.4, 1112.4], [1, 1000.3, 900.3, 1112.4, 1012.4]], np.float32)


def fpn_level(rois: np.ndarray) -> np.ndarray:
    """The level docs/operators.md gives each RoI, in float64 from the values as given."""
    r = rois.astype(np.float64)
    scale = np.sqrt((r[:, 3] - r[:, 1]) * (r[:, 4] - r[:, 2]))
    return np.clip(np.floor(np.log2(scale / FPN_FINEST + 1e-6)), 0, len(FPN_STRIDES) - 1).astype(int)


def fpn_case(rng):
    """(model, feeds, want): float16 maps of a 1280 px image, float32 RoIs, float16 output."""
    from dcnkit import reference as ref

    c = 2
    feats = [rng.standard_normal((2, c, 320, 320)).astype(np.float16),
             rng.standard_normal((2, c, 160, 160)).astype(np.float16)]
    rois = fpn_boxes()
    node = helper.make_node("MultiLevelRoIAlign", ["rois", "f0", "f1"], ["y"], domain="dcnkit", name="fpn",
                            output_size=[3, 3], featmap_strides=list(FPN_STRIDES), sampling_ratio=2,
                            finest_scale=FPN_FINEST, roi_scale_factor=1.0, aligned=1, pool_mode="avg")
    g = helper.make_graph([node], "fpn", [helper.make_tensor_value_info("rois", T.FLOAT, ["K", 5]),
                                          helper.make_tensor_value_info("f0", T.FLOAT16, [2, c, 320, 320]),
                                          helper.make_tensor_value_info("f1", T.FLOAT16, [2, c, 160, 160])],
                          [helper.make_tensor_value_info("y", T.FLOAT16, ["K", c, 3, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                              ir_version=9)
    want = ref.multi_level_roi_align([f.astype(np.float64) for f in feats], rois.astype(np.float64), (3, 3),
                                     list(FPN_STRIDES), 2, FPN_FINEST, 1.0, True, "avg")
    return model, {"rois": rois, "f0": feats[0], "f1": feats[1]}, want


def feeds_at(model, shapes: dict, which: int, rng) -> dict:
    """Random feeds at profile point ``which`` (0 min, 2 max): RoIs valid for the first 4-D input's batch."""
    dims = {name: tuple(s[which]) for name, s in shapes.items()}
    batch = next((d[0] for d in dims.values() if len(d) == 4), 1)
    out = {}
    for name, d in dims.items():
        if len(d) == 2 and d[1] == 5:
            k = d[0]
            x = np.sort(rng.uniform(0, 30, (k, 2)), axis=1)
            y = np.sort(rng.uniform(0, 30, (k, 2)), axis=1)
            out[name] = np.stack([rng.integers(0, batch, k), x[:, 0], y[:, 0], x[:, 1], y[:, 1]], 1).astype(np.float32)
        else:
            out[name] = rng.standard_normal(d).astype(np.float32)
    return out


def _run(cmd, timeout=600):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return p.returncode, (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]


def check_trtexec(cases, workdir: Path):
    """trtexec --dynamicPlugins (build + run) and --useCudaGraph, on the DeformConv2d case."""
    import onnx

    import dcnkit

    trtexec = shutil.which("trtexec")
    if trtexec is None:
        return [("trtexec --dynamicPlugins", "skipped: trtexec is not on PATH", ""),
                ("trtexec --useCudaGraph", "skipped: trtexec is not on PATH", "")]
    lib = dcnkit.tensorrt_library()
    name, model, _, _, prof = cases[0]
    path, engine = workdir / "dcn.onnx", workdir / "dcn.engine"
    onnx.save(model, str(path))
    shape = {flag: ",".join(f"{n}:" + "x".join(map(str, dims[i])) for n, dims in prof.items())
             for i, flag in enumerate(("--minShapes", "--optShapes", "--maxShapes"))}
    build = [trtexec, f"--onnx={path}", f"--saveEngine={engine}", f"--dynamicPlugins={lib}"]
    build += [f"{k}={v}" for k, v in shape.items()]
    rc, tail = _run(build)
    out = [("trtexec --dynamicPlugins", "ok" if rc == 0 else "FAILED", tail[0])]
    run = [trtexec, f"--loadEngine={engine}", f"--dynamicPlugins={lib}", f"--shapes={shape['--optShapes']}"]
    rc2, tail2 = _run(run + ["--useCudaGraph"]) if rc == 0 else (1, ["no engine"])
    out.append(("trtexec --useCudaGraph", "ok" if rc2 == 0 else "FAILED", tail2[0]))
    return out


def check_serialization(cases):
    """Every case: an engine built with its dynamic profile deserializes in a fresh runtime and gets a context."""
    import tensorrt as trt
    from polygraphy.backend.trt import util as trt_util

    from dcnkit.runtime.tensorrt import build_engine_bytes, load_plugins

    load_plugins()
    runtime = trt.Runtime(trt_util.get_trt_logger())
    bad = []
    for name, model, _, _, prof in cases:
        try:
            engine = runtime.deserialize_cuda_engine(build_engine_bytes(model, shapes=prof))
            if engine is None or engine.create_execution_context() is None:
                bad.append(name)
        except Exception as e:  # one creator must not hide the others
            bad.append(f"{name} ({type(e).__name__}: {e})")
    return [("serialize/deserialize every creator", "FAILED" if bad else "ok", "; ".join(bad))]


def check_sanitizer(script: Path):
    """Re-runs this script's min/max-dims pass under compute-sanitizer memcheck."""
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        return [("compute-sanitizer min/max dims", "skipped: compute-sanitizer is not on PATH", "")]
    rc, tail = _run([sanitizer, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script),
                     "--min-max-dims"], timeout=1800)
    return [("compute-sanitizer min/max dims", "ok" if rc == 0 else "FAILED", tail[0])]


def run_min_max_dims(cases) -> int:
    """Every case at its profile's min and max dims (the child of check_sanitizer); non-zero on an error."""
    from dcnkit.runtime.tensorrt import TensorRTRunner

    rng = np.random.default_rng(0)
    failures = 0
    for name, model, _, _, prof in cases:
        with TensorRTRunner(model, shapes=prof) as r:
            for which in (0, 2):
                try:
                    r.run(feeds_at(model, prof, which, rng))
                except Exception as e:
                    failures += 1
                    print(f"{name} at {'min' if which == 0 else 'max'} dims: {type(e).__name__}: {e}")
    return 1 if failures else 0


def check_fpn_precision(rng):
    from dcnkit.runtime.tensorrt import TensorRTRunner

    model, feeds, want = fpn_case(rng)
    with TensorRTRunner(model) as r:
        got = list(r.run(feeds).values())[0].astype(np.float64)
    err = float(np.abs(got - want).max())
    ok = got.shape == want.shape and np.all(np.abs(got - want) <= 2e-2 + 2e-2 * np.abs(want))
    return [("fp16 FPN RoI level (float32 RoIs)", "ok" if ok else "FAILED", f"max err {err:.3g}")]


def check_two_contexts(cases):
    """Device memory taken by the first and the second execution context of the DeformConv2d engine."""
    import tensorrt as trt
    from polygraphy import cuda
    from polygraphy.backend.trt import util as trt_util

    from dcnkit.runtime.tensorrt import build_engine_bytes, load_plugins

    load_plugins()
    name, model, _, _, prof = cases[0]
    engine = trt.Runtime(trt_util.get_trt_logger()).deserialize_cuda_engine(build_engine_bytes(model, shapes=prof))
    free = [cuda.wrapper().mem_get_info()[0]]
    contexts = []
    for _ in range(2):
        contexts.append(engine.create_execution_context())
        free.append(cuda.wrapper().mem_get_info()[0])
    first, second = free[0] - free[1], free[1] - free[2]
    ok = all(c is not None for c in contexts) and second <= first + (1 << 20)
    return [("two contexts' memory", "ok" if ok else "FAILED",
             f"{name}: first {first / 2**20:.1f} MiB, second {second / 2**20:.1f} MiB")]


def run_all(cases, script: Path, rng) -> int:
    """Runs every check above, prints one line each; returns the number of failures."""
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        results = check_trtexec(cases, Path(tmp))
        for fn in (lambda: check_serialization(cases), lambda: check_sanitizer(script),
                   lambda: check_fpn_precision(rng), lambda: check_two_contexts(cases)):
            try:
                results += fn()
            except Exception as e:
                results.append((getattr(fn, "__name__", "check"), "FAILED", f"{type(e).__name__}: {e}"))
    for name, result, detail in results:
        failures += result == "FAILED"
        print(f"{name:<40} {result}  {detail}".rstrip())
    return failures
