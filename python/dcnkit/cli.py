"""The ``dcnkit`` command line: export, run, compare, bench, backends, demo (+ serve / triton-repo).

Every command has ``--help``. Errors in arguments print one line naming the argument and exit with code 2;
``compare`` exits with 1 when backends disagree.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

PROG = "dcnkit"

_DTYPES = {
    "float32": np.float32,
    "f32": np.float32,
    "float": np.float32,
    "float16": np.float16,
    "f16": np.float16,
    "half": np.float16,
    "float64": np.float64,
    "f64": np.float64,
    "double": np.float64,
    "int64": np.int64,
    "i64": np.int64,
    "int32": np.int32,
    "i32": np.int32,
    "bool": np.bool_,
}

SPEC_HELP = (
    "NAME:SHAPE[:DTYPE[LOW,HIGH]]; SHAPE like 1x3x64x64; DTYPE float32 (default), float16, float64, int64, "
    "int32, bool, optionally with a value range, e.g. idx:8:int64[0,4] (ints in [0,4)) or x:1x3x8x8:float32[-1,1]. "
    "NAME:rois:K makes K valid RoIs (K, 5) [batch_index, x1, y1, x2, y2] for the first 4-D input "
    "(batch index in [0, N), boxes inside its H x W). Without a spec, random inputs are normal floats, "
    "valid RoIs for (K, 5) inputs named *roi*, and indices in [0, N) for integer inputs named *batch*."
)


class CliError(Exception):
    """An error in the command line: ``arg`` names the argument; exit code 2."""

    def __init__(self, arg: str, message: str):
        super().__init__(f"{arg}: {message}")
        self.arg = arg


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit code 2)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# ------------------------------------------------------------------------------------------------
# Input specifications
# ------------------------------------------------------------------------------------------------
class InputSpec:
    """One ``--input`` / ``--shape``: a name and what to generate."""

    def __init__(self, name, shape=None, dtype=np.float32, low=None, high=None, rois=None):
        self.name, self.shape, self.dtype, self.low, self.high, self.rois = name, shape, dtype, low, high, rois

    def __repr__(self):
        return f"InputSpec({self.name!r}, shape={self.shape}, dtype={np.dtype(self.dtype).name}, rois={self.rois})"


def parse_shape(text: str, arg: str) -> tuple[int, ...]:
    text = text.strip()
    if text in ("", "scalar"):
        return ()
    parts = re.split(r"[x,]", text)
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise CliError(arg, f"expected a shape like 1x3x64x64, got {text!r}") from None
    if any(d < 0 for d in dims):
        raise CliError(arg, f"expected non-negative dims, got {text!r}")
    return dims


def parse_input_spec(text: str, arg: str = "--input") -> InputSpec:
    """``NAME:SHAPE[:DTYPE[LOW,HIGH]]`` or ``NAME:rois:K``."""
    parts = text.split(":")
    if len(parts) < 2 or not parts[0]:
        raise CliError(arg, f"expected NAME:SHAPE[:DTYPE] or NAME:rois:K, got {text!r}")
    name = parts[0]
    if parts[1] == "rois":
        if len(parts) != 3:
            raise CliError(arg, f"expected NAME:rois:K (K RoIs), got {text!r}")
        try:
            k = int(parts[2])
        except ValueError:
            raise CliError(arg, f"expected an integer K in NAME:rois:K, got {parts[2]!r}") from None
        if k < 0:
            raise CliError(arg, f"expected K >= 0 in NAME:rois:K, got {k}")
        return InputSpec(name, (k, 5), np.float32, rois=k)
    if len(parts) > 3:
        raise CliError(arg, f"expected NAME:SHAPE[:DTYPE], got {text!r}")
    shape = parse_shape(parts[1], arg)
    dtype, low, high = None, None, None  # None: the model's dtype (float32 for export)
    if len(parts) == 3:
        m = re.fullmatch(r"([a-z0-9]+)(?:\[\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*[\])])?", parts[2])
        if not m or m.group(1) not in _DTYPES:
            raise CliError(arg, f"expected a dtype in {sorted(set(_DTYPES))} (optionally [LOW,HIGH]), got {parts[2]!r}")
        dtype = _DTYPES[m.group(1)]
        if m.group(2) is not None:
            low, high = float(m.group(2)), float(m.group(3))
            if not high > low:
                raise CliError(arg, f"expected LOW < HIGH in {parts[2]!r}, got [{low}, {high}]")
    return InputSpec(name, shape, dtype, low, high)


def random_rois(rng, k: int, batch: int, height: int, width: int, dtype=np.float32) -> np.ndarray:
    """``k`` valid RoIs [batch_index, x1, y1, x2, y2] inside an image of ``height x width``."""
    batch = max(int(batch), 1)
    b = rng.integers(0, batch, size=k).astype(np.float64)
    x = np.sort(rng.uniform(0, max(width - 1, 1), size=(k, 2)), axis=1)
    y = np.sort(rng.uniform(0, max(height - 1, 1), size=(k, 2)), axis=1)
    return np.stack([b, x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1).astype(dtype)


def random_array(rng, shape, dtype, low=None, high=None) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(dtype, np.integer):
        lo = 0 if low is None else int(low)
        hi = 2 if high is None else int(high)
        return rng.integers(lo, hi, size=shape).astype(dtype)
    if low is not None:
        return rng.uniform(low, high, size=shape).astype(dtype)
    return rng.standard_normal(size=shape).astype(dtype)


def _looks_like_rois(info) -> bool:
    return len(info.shape) == 2 and info.shape[1] == 5 and "roi" in info.name.lower()


def make_feeds(infos, specs: dict[str, InputSpec], rng, batch: int | None = None, arg: str = "--shape") -> dict:
    """Random feeds for a model's inputs (``TensorInfo`` list); symbolic dims from ``specs``; ``batch``
    fills a symbolic first dim. Inputs named like ``rois`` with shape (K, 5) get valid RoIs."""
    unknown = [n for n in specs if n not in {i.name for i in infos}]
    if unknown:
        raise CliError(arg, f"expected input names among {[i.name for i in infos]}, got {unknown}")
    shapes = {}
    for info in infos:
        spec = specs.get(info.name)
        if spec is not None:
            shape = tuple(spec.shape)
            if len(shape) != len(info.shape):
                raise CliError(arg, f"{info.name}: expected rank {len(info.shape)} {info.shape}, got {shape}")
            for want, got in zip(info.shape, shape):
                if isinstance(want, int) and want != got:
                    raise CliError(arg, f"{info.name}: expected shape {info.shape}, got {shape}")
        else:
            shape = []
            for i, d in enumerate(info.shape):
                if isinstance(d, int) and d >= 0:
                    shape.append(d)
                elif i == 0 and batch is not None:
                    shape.append(int(batch))
                else:
                    shown = "x".join(str(s) if isinstance(s, int) else "?" for s in info.shape)
                    raise CliError(
                        arg, f"input {info.name!r} has symbolic dims {info.shape}: give {arg} {info.name}:{shown}"
                    )
            shape = tuple(shape)
        shapes[info.name] = shape
    image = next((shapes[i.name] for i in infos if len(shapes[i.name]) == 4), None)
    feeds = {}
    for info in infos:
        spec = specs.get(info.name)
        shape = shapes[info.name]
        if (spec is not None and spec.rois is not None) or (spec is None and _looks_like_rois(info)):
            n, h, w = (image[0], image[2], image[3]) if image else (1, 32, 32)
            feeds[info.name] = random_rois(rng, shape[0], n, h, w, info.dtype)
        elif spec is not None and spec.low is not None:
            feeds[info.name] = random_array(rng, shape, spec.dtype or info.dtype, spec.low, spec.high)
        elif np.issubdtype(np.dtype(spec.dtype if spec is not None and spec.dtype else info.dtype), np.integer) \
                and "batch" in info.name.lower():
            # Batch indices (ONNX RoiAlign's batch_indices): valid for the first 4-D input.
            feeds[info.name] = random_array(rng, shape, (spec and spec.dtype) or info.dtype, 0, image[0] if image else 1)
        else:
            feeds[info.name] = random_array(rng, shape, (spec and spec.dtype) or info.dtype)
    return feeds


def load_npz(path: str, arg: str = "--inputs") -> dict:
    p = Path(path)
    if not p.is_file():
        raise CliError(arg, f"expected an existing .npz file, got {path!r}")
    try:
        with np.load(p, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except Exception as e:
        raise CliError(arg, f"expected a NumPy .npz file, got {path!r} ({type(e).__name__}: {e})") from None


def _check_model_path(path: str, arg: str = "model") -> str:
    if not Path(path).is_file():
        raise CliError(arg, f"expected an existing ONNX file, got {path!r}")
    return path


def _parse_backends(text: str | None, arg: str = "--backends") -> list[str] | None:
    from dcnkit.runtime.runners import BACKENDS

    if text is None:
        return None
    names = [b.strip() for b in text.split(",") if b.strip()]
    if not names:
        raise CliError(arg, f"expected a comma-separated list of {', '.join(BACKENDS)}, got {text!r}")
    for b in names:
        if b not in BACKENDS:
            raise CliError(arg, f"expected backends among {', '.join(BACKENDS)}, got {b!r}")
    if len(set(names)) != len(names):
        raise CliError(arg, f"expected each backend once, got {text!r}")
    return names


def _feeds_for(args, infos) -> dict:
    if getattr(args, "inputs", None):
        feeds = load_npz(args.inputs)
        names = [i.name for i in infos]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise CliError("--inputs", f"expected arrays {names}, got {sorted(feeds)} (missing {missing})")
        return {n: feeds[n] for n in names}
    specs = {}
    for text in getattr(args, "shape", None) or []:
        s = parse_input_spec(text, "--shape")
        specs[s.name] = s
    rng = np.random.default_rng(args.seed)
    return make_feeds(infos, specs, rng, batch=getattr(args, "batch", None))


def _progress(iterable=None, **kw):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover
        return iterable
    kw.setdefault("disable", not sys.stderr.isatty() and os.environ.get("DCNKIT_PROGRESS") != "1")
    kw.setdefault("leave", False)
    return tqdm(iterable, **kw)


# ------------------------------------------------------------------------------------------------
# export
# ------------------------------------------------------------------------------------------------
def load_factory(target: str):
    """``MODULE:FACTORY`` (MODULE importable, or a path to a .py file) -> the callable."""
    if ":" not in target:
        raise CliError("factory", f"expected MODULE:FACTORY (e.g. mypkg.models:build or models.py:build), got {target!r}")
    mod_name, _, attr = target.rpartition(":")
    if not mod_name or not attr:
        raise CliError("factory", f"expected MODULE:FACTORY, got {target!r}")
    if mod_name.endswith(".py") or os.sep in mod_name or Path(mod_name).is_file():
        path = Path(mod_name)
        if not path.is_file():
            raise CliError("factory", f"expected an existing Python file, got {mod_name!r}")
        spec = importlib.util.spec_from_file_location(f"_dcnkit_factory_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
    else:
        try:
            module = importlib.import_module(mod_name)
        except ImportError as e:
            raise CliError("factory", f"expected an importable module, got {mod_name!r} ({e})") from None
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError("factory", f"expected {mod_name!r} to define {attr!r}, it does not")
        obj = getattr(obj, part)
    if not callable(obj):
        raise CliError("factory", f"expected a callable {attr!r}, got {type(obj).__name__}")
    return obj


def _parse_kwargs(items, arg="--arg") -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise CliError(arg, f"expected KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = v
    return out


def cmd_export(args) -> int:
    import torch

    import dcnkit.export as dk_export

    factory = load_factory(args.factory)
    if not args.input:
        raise CliError("--input", "expected at least one NAME:SHAPE (the model's example inputs)")
    specs = [parse_input_spec(t, "--input") for t in args.input]
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise CliError("--input", f"expected each input name once, got {names}")
    steps = _progress(total=3, desc="export", unit="step")

    def step(msg):
        if hasattr(steps, "set_postfix_str"):
            steps.set_postfix_str(msg)
            steps.update(1)

    model = factory(**_parse_kwargs(args.arg))
    if not isinstance(model, torch.nn.Module):
        raise CliError("factory", f"expected the factory to return a torch.nn.Module, got {type(model).__name__}")
    if args.checkpoint:
        ckpt = Path(args.checkpoint)
        if not ckpt.is_file():
            raise CliError("--checkpoint", f"expected an existing file, got {args.checkpoint!r}")
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        try:
            model.load_state_dict(state)
        except Exception as e:
            raise CliError("--checkpoint", f"expected a state_dict matching the model, got: {str(e).splitlines()[0]}")
    model.eval()
    step("model built")
    rng = np.random.default_rng(args.seed)
    image = next((s.shape for s in specs if s.rois is None and len(s.shape) == 4), None)
    example = []
    for s in specs:
        if s.rois is not None:
            n, h, w = (image[0], image[2], image[3]) if image else (1, 32, 32)
            a = random_rois(rng, s.rois, n, h, w)
        else:
            a = random_array(rng, s.shape, s.dtype or np.float32, s.low, s.high)
        example.append(torch.from_numpy(a))
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    kwargs = dict(standard_ops=not args.custom_ops, dynamic_batch=not args.no_dynamic_batch)
    if args.opset is not None:
        kwargs["opset"] = args.opset
    if args.dynamo is not None:
        kwargs["dynamo"] = args.dynamo
    kwargs["input_names"] = names
    roi_names = [s.name for s in specs if s.rois is not None]
    if roi_names:
        kwargs["roi_inputs"] = roi_names
    if args.output_names:
        kwargs["output_names"] = [n.strip() for n in args.output_names.split(",")]
    import inspect

    params = inspect.signature(dk_export.to_onnx).parameters
    if not any(p.kind == p.VAR_KEYWORD for p in params.values()):
        dropped = [k for k in kwargs if k not in params and k not in ("input_names", "output_names", "roi_inputs")]
        if dropped:
            raise CliError(dropped[0].replace("_", "-").join(["--", ""]), "not supported by dcnkit.export.to_onnx")
        kwargs = {k: v for k, v in kwargs.items() if k in params}
    with torch.no_grad():
        dk_export.to_onnx(model, tuple(example), str(out), **kwargs)
    step("exported")
    import onnx

    m = onnx.load(str(out))
    step("checked")
    if hasattr(steps, "close"):
        steps.close()
    ops = sorted({(n.domain or "ai.onnx", n.op_type) for n in m.graph.node if n.op_type in
                  ("DeformConv", "RoiAlign", "DeformConv2d", "RoIAlign", "DeformRoIPool", "DeformPSRoIPool",
                   "MultiLevelRoIAlign", "MultiScaleDeformableAttention")})
    print(f"exported {out} ({out.stat().st_size / 1024:.1f} KiB, {len(m.graph.node)} nodes"
          + (", " + ", ".join(f"{d}::{t}" for d, t in ops) if ops else "") + ")")
    return 0


# ------------------------------------------------------------------------------------------------
# run
# ------------------------------------------------------------------------------------------------
def _describe(a: np.ndarray) -> str:
    if a.size and np.issubdtype(a.dtype, np.number):
        f = a.astype(np.float64)
        return f"{a.dtype} {tuple(a.shape)} min={f.min():.6g} max={f.max():.6g} mean={f.mean():.6g}"
    return f"{a.dtype} {tuple(a.shape)}"


def _make_runner_cli(model, backend, arg="--backend", kit_kernels=True):
    """A runner; a backend that cannot run here raises BackendUnavailable (main: one line, exit code 1)."""
    from dcnkit.runtime.runners import make_runner
    from dcnkit.runtime.tensorrt import is_engine_file

    if is_engine_file(model) and backend != "tensorrt":
        raise CliError(arg, f"expected tensorrt for the engine file {str(model)!r}, got {backend!r}")
    return make_runner(model, backend, kit_kernels=kit_kernels)


def _add_kit_kernels_arg(p):
    p.add_argument("--no-kit-kernels", dest="kit_kernels", action="store_false",
                   help="ONNX Runtime: run standard DeformConv nodes on ONNX Runtime's built-in kernel (default: on "
                   "the kit's DeformConv2d kernel, an in-memory rewrite; the file is not changed)")


def _require_backends(requested, available) -> None:
    """Backends named on the command line must be able to run here (BackendUnavailable otherwise)."""
    from dcnkit.runtime.runners import BackendUnavailable

    for b in requested or []:
        if available.get(b) is not None:
            raise BackendUnavailable(f"{b}: {available[b]}")


def cmd_run(args) -> int:
    from dcnkit.runtime.runners import check_backend

    _check_model_path(args.model)
    try:
        check_backend(args.backend)
    except ValueError as e:
        raise CliError("--backend", str(e).split(": ", 1)[1]) from None
    with _make_runner_cli(args.model, args.backend, kit_kernels=args.kit_kernels) as runner:
        feeds = _feeds_for(args, runner.inputs())
        t0 = time.perf_counter()
        outs = runner.run(feeds)
        dt = time.perf_counter() - t0
    for k, v in feeds.items():
        print(f"input  {k}: {_describe(v)}")
    for k, v in outs.items():
        print(f"output {k}: {_describe(v)}")
    print(f"{args.backend}: {dt * 1e3:.2f} ms")
    if args.output:
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        np.savez(out, **outs)
        print(f"saved outputs to {out}")
    if args.save_inputs:
        p = Path(args.save_inputs)
        p.parent.mkdir(parents=True, exist_ok=True)
        np.savez(p, **feeds)
        print(f"saved inputs to {p}")
    return 0


# ------------------------------------------------------------------------------------------------
# compare
# ------------------------------------------------------------------------------------------------
FAST_BACKENDS = ("ort-cpu", "ort-cuda", "tensorrt")
_DEFAULT_TOL = 1e-4


def choose_compare_backends(requested: list[str] | None, available: dict) -> tuple[list[str], list[str]]:
    """(backends to compare, skipped lines). Default: every available fast backend; the reference runner
    joins when fewer than two would be compared."""
    chosen, skipped = [], []
    for b in FAST_BACKENDS if requested is None else requested:
        if available.get(b) is None:
            chosen.append(b)
        else:
            skipped.append(f"{b} skipped: {available[b]}")
    if len(chosen) < 2 and "reference" not in chosen and available.get("reference") is None:
        chosen.append("reference")
    return chosen, skipped


def format_stats(rows) -> list[str]:
    lines = [f"{'output':<20} {'backend':<12} {'vs':<12} {'max_abs':>10} {'mean_abs':>10} {'max_rel':>10} {'mean_rel':>10}"]
    for r in rows:
        if r.get("shape_mismatch"):
            lines.append(f"{r['output']:<20} {r['runner']:<12} {r['reference']:<12} shapes differ")
            continue
        lines.append(
            f"{r['output']:<20} {r['runner']:<12} {r['reference']:<12} {r['max_abs']:>10.3g} {r['mean_abs']:>10.3g} "
            f"{r['max_rel']:>10.3g} {r['mean_rel']:>10.3g}" + ("  NaN!" if r.get("nan") else "")
        )
    return lines


def parse_tolerances(values, arg: str, default: float) -> dict[str, float]:
    """``--atol`` / ``--rtol`` values as Polygraphy takes them: each ``VALUE`` (every output) or
    ``OUTPUT:VALUE`` (that output), repeatable and comma-separated; later entries win. Returns a dict with
    the key ``""`` for the default (Polygraphy's convention)."""
    tol = {"": float(default)}
    for text in values or []:
        for item in str(text).split(","):
            item = item.strip()
            if not item:
                raise CliError(arg, f"expected VALUE or OUTPUT:VALUE (comma-separated), got {text!r}")
            name, sep, value = item.rpartition(":")
            if sep and not name:
                raise CliError(arg, f"expected an output name before ':' in {item!r}")
            try:
                v = float(value)
            except ValueError:
                raise CliError(arg, f"expected a number in {item!r} (VALUE or OUTPUT:VALUE), got {value!r}") from None
            if not v >= 0 or v == float("inf"):
                raise CliError(arg, f"expected a finite tolerance >= 0 in {item!r}, got {v:g}")
            tol[name] = v
    return tol


def check_tolerance_names(tol: dict[str, float], outputs: list[str], arg: str) -> None:
    """Every named output of a per-output tolerance is an output of the model."""
    unknown = [n for n in tol if n and n not in outputs]
    if unknown:
        raise CliError(arg, f"expected output names among {outputs}, got {unknown}")


def format_tolerances(atol: dict[str, float], rtol: dict[str, float]) -> str:
    parts = [f"atol={atol['']:g}, rtol={rtol['']:g}"]
    for name in sorted({n for n in list(atol) + list(rtol) if n}):
        parts.append(f"{name}: atol={atol.get(name, atol['']):g}, rtol={rtol.get(name, rtol['']):g}")
    return "; ".join(parts)


def _model_output_names(path: str) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]


def cmd_compare(args) -> int:
    from dcnkit.polygraphy_ext import compare_backends
    from dcnkit.runtime.runners import available_backends, make_runner

    _check_model_path(args.model)
    requested = _parse_backends(args.backends)
    from dcnkit.runtime.tensorrt import is_engine_file

    if is_engine_file(args.model):
        raise CliError("model", f"expected the ONNX file (every backend runs it; tensorrt builds it), got {args.model!r}")
    atol = parse_tolerances(args.atol, "--atol", _DEFAULT_TOL)
    rtol = parse_tolerances(args.rtol, "--rtol", _DEFAULT_TOL)
    if len(atol) > 1 or len(rtol) > 1:
        outputs = _model_output_names(args.model)
        check_tolerance_names(atol, outputs, "--atol")
        check_tolerance_names(rtol, outputs, "--rtol")
    avail = available_backends()
    _require_backends(requested, avail)
    chosen, skipped = choose_compare_backends(requested, avail)
    for line in skipped:
        print(line)
    if len(chosen) < 2:
        raise CliError("--backends", f"expected at least two usable backends, got {chosen}")
    with make_runner(args.model, "reference") as r:
        infos = r.inputs()
    rng_feeds = []
    if args.inputs:
        rng_feeds = [_feeds_for(args, infos)]
    else:
        for i in range(args.iterations):
            args_seed = args.seed + i
            specs = {s.name: s for s in (parse_input_spec(t, "--shape") for t in args.shape or [])}
            rng_feeds.append(make_feeds(infos, specs, np.random.default_rng(args_seed), batch=args.batch))
    print(f"comparing {', '.join(chosen)} on {args.model} ({len(rng_feeds)} input set(s); "
          f"{format_tolerances(atol, rtol)})")
    passed, stats, _ = compare_backends(args.model, chosen, rng_feeds, atol=atol, rtol=rtol,
                                        quiet=not args.verbose)
    for line in format_stats(stats):
        print(line)
    print("PASSED" if passed else "FAILED: outputs differ beyond atol/rtol")
    return 0 if passed else 1


# ------------------------------------------------------------------------------------------------
# bench
# ------------------------------------------------------------------------------------------------
def bench_runner(runner, feeds, warmup: int, iterations: int, desc: str = "") -> np.ndarray:
    for _ in range(warmup):
        runner.run(feeds)
    times = []
    for _ in _progress(range(iterations), desc=desc, unit="it"):
        t0 = time.perf_counter()
        runner.run(feeds)
        times.append(time.perf_counter() - t0)
    return np.asarray(times)


def cmd_bench(args) -> int:
    from dcnkit.runtime.runners import available_backends

    _check_model_path(args.model)
    if args.iterations < 1:
        raise CliError("--iterations", f"expected >= 1, got {args.iterations}")
    if args.warmup < 0:
        raise CliError("--warmup", f"expected >= 0, got {args.warmup}")
    if args.batch < 1:
        raise CliError("--batch", f"expected >= 1, got {args.batch}")
    avail = available_backends()
    requested = _parse_backends(args.backends)
    from dcnkit.runtime.tensorrt import is_engine_file

    if requested is None and is_engine_file(args.model):
        requested = ["tensorrt"]
    _require_backends(requested, avail)
    if requested is None:
        requested = [b for b in FAST_BACKENDS if avail[b] is None] or ["ort-cpu"]
    rows = []
    for b in requested:
        if avail.get(b) is not None:
            print(f"{b} skipped: {avail[b]}")
            continue
        with _make_runner_cli(args.model, b, "--backends", kit_kernels=args.kit_kernels) as runner:
            feeds = _feeds_for(args, runner.inputs())
            times = bench_runner(runner, feeds, args.warmup, args.iterations, desc=b)
        batch = next(iter(feeds.values())).shape[0] if feeds and next(iter(feeds.values())).ndim else 1
        p50, p90, p99 = np.percentile(times, [50, 90, 99]) * 1e3
        rows.append(dict(backend=b, batch=int(batch), iterations=len(times), p50_ms=p50, p90_ms=p90, p99_ms=p99,
                         mean_ms=float(times.mean() * 1e3), throughput=float(batch / times.mean())))
    if not rows:
        raise CliError("--backends", f"expected at least one usable backend, got none of {requested}")
    print(f"{'backend':<12} {'batch':>5} {'iters':>6} {'p50 ms':>9} {'p90 ms':>9} {'p99 ms':>9} {'samples/s':>11}")
    for r in rows:
        print(f"{r['backend']:<12} {r['batch']:>5} {r['iterations']:>6} {r['p50_ms']:>9.3f} {r['p90_ms']:>9.3f} "
              f"{r['p99_ms']:>9.3f} {r['throughput']:>11.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


# ------------------------------------------------------------------------------------------------
# backends, demo
# ------------------------------------------------------------------------------------------------
def cmd_backends(args) -> int:
    from dcnkit.runtime.runners import available_backends

    for name, reason in available_backends().items():
        print(f"{name:<10} {'available' if reason is None else 'unavailable: ' + reason}")
    return 0


def cmd_demo(args) -> int:
    from dcnkit import demo

    return demo.main_from_args(args)


# ------------------------------------------------------------------------------------------------
# Parser
# ------------------------------------------------------------------------------------------------
def _add_input_args(p, with_batch=True):
    p.add_argument("--inputs", metavar="NPZ", help="input arrays (.npz, one array per model input)")
    p.add_argument("--shape", action="append", metavar="SPEC",
                   help="shape (and dtype) of a random input, needed for symbolic dims; " + SPEC_HELP)
    if with_batch:
        p.add_argument("--batch", type=int, default=1, help="value of a symbolic first (batch) dim (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="dcnkit: deformable convolution and RoI pooling that ship.")
    from dcnkit import __version__

    parser.add_argument("--version", action="version", version=f"dcnkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("export", help="export a PyTorch model (from a factory) to ONNX",
                       description="Build a model with MODULE:FACTORY, optionally load a checkpoint, export it with "
                       "dcnkit.export.to_onnx.")
    p.add_argument("factory", metavar="MODULE:FACTORY",
                   help="a callable returning a torch.nn.Module; MODULE is importable or a path to a .py file")
    p.add_argument("-o", "--output", required=True, help="the ONNX file to write")
    p.add_argument("--input", action="append", metavar="SPEC", help="an example input (repeat, in order); " + SPEC_HELP)
    p.add_argument("--arg", action="append", metavar="KEY=VALUE", help="keyword argument for the factory (JSON value)")
    p.add_argument("--checkpoint", help="a state_dict (torch.save) to load into the model")
    p.add_argument("--custom-ops", action="store_true",
                   help="emit dcnkit-domain nodes for every op (default: standard DeformConv/RoiAlign where identical)")
    p.add_argument("--no-dynamic-batch", action="store_true", help="fixed batch dim (default: symbolic)")
    p.add_argument("--opset", type=int, help="ONNX opset (default: the exporter's)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--dynamo", dest="dynamo", action="store_true", default=None, help="torch.export-based exporter")
    g.add_argument("--legacy", dest="dynamo", action="store_false", help="TorchScript-based exporter")
    p.add_argument("--output-names", help="comma-separated output names")
    p.add_argument("--seed", type=int, default=0, help="seed of the example inputs")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("run", help="run an ONNX model on one backend and save its outputs",
                       description="Run an ONNX model (random inputs of the model's shapes unless --inputs).")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--backend", default="ort-cpu", help="ort-cpu (default), ort-cuda, tensorrt, reference; tensorrt "
                   "builds an ONNX file on the fly or runs an engine file (.engine/.plan/.trt, from dcnkit build)")
    _add_input_args(p)
    p.add_argument("-o", "--output", help="save the outputs to this .npz")
    p.add_argument("--save-inputs", metavar="NPZ", help="save the inputs used to this .npz")
    _add_kit_kernels_arg(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compare", help="compare backends on a model with Polygraphy",
                       description="Run the model on several backends through Polygraphy's Comparator and check "
                       "each against the first with CompareFunc.simple(atol, rtol). Exit code 1 on a mismatch.")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--backends", help="comma-separated, first is the reference of the comparison (default: every "
                   "available fast backend; the NumPy reference joins when only one is present)")
    p.add_argument("--atol", action="append", metavar="[OUTPUT:]VALUE",
                   help="absolute tolerance (default 1e-4): a bare VALUE for every output, OUTPUT:VALUE for one "
                   "output (as Polygraphy), repeatable or comma-separated, e.g. --atol 1e-4 --atol boxes:0.05")
    p.add_argument("--rtol", action="append", metavar="[OUTPUT:]VALUE",
                   help="relative tolerance (default 1e-4), same forms as --atol, e.g. --rtol scores:1e-3")
    p.add_argument("--iterations", type=int, default=1, help="random input sets (default 1)")
    p.add_argument("-v", "--verbose", action="store_true", help="show Polygraphy's own log")
    _add_input_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("bench", help="latency percentiles and throughput per backend",
                       description="Time model inference: p50/p90/p99 latency and throughput per backend.")
    p.add_argument("model", help="ONNX file")
    p.add_argument("--backends", help="comma-separated (default: every available fast backend)")
    p.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    p.add_argument("--iterations", type=int, default=50, help="timed runs (default 50)")
    p.add_argument("--json", help="also write the results to this JSON file")
    _add_kit_kernels_arg(p)
    _add_input_args(p)
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("backends", help="list the backends and why any is unavailable",
                       description="List the backends and why any is unavailable.")
    p.set_defaults(func=cmd_backends)

    from dcnkit import demo

    p = sub.add_parser("demo", help="train, export and check a small DCNv2 classifier end to end",
                       description=demo.__doc__.strip().splitlines()[0])
    demo.add_arguments(p)
    p.set_defaults(func=cmd_demo)

    from dcnkit import cli_build

    cli_build.register(sub)
    _register_server_commands(sub)
    return parser


def _register_server_commands(sub):
    try:
        server_cli = importlib.import_module("dcnkit.server.cli")
        server_cli.register_commands(sub)
        return
    except Exception as e:  # the server is optional: keep the rest of the CLI working
        reason = f"{type(e).__name__}: {e}"
    for name, what in (("serve", "the inference server"), ("triton-repo", "the Triton model repository writer")):
        if name in sub.choices:
            continue
        p = sub.add_parser(name, help=f"{what} (unavailable: dcnkit.server.cli could not be loaded)",
                           description=f"{what}: unavailable here ({reason}).")

        def unavailable(args, name=name, reason=reason):
            raise CliError(name, f"unavailable: dcnkit.server.cli could not be loaded ({reason})")

        p.set_defaults(func=unavailable)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = f"{PROG} {args.command}"
    from dcnkit.runtime.runners import BackendUnavailable

    try:
        rc = args.func(args)
    except BackendUnavailable as e:  # the backend cannot run on this machine: what is missing, one line
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 1
    except CliError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except FileNotFoundError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # pragma: no cover
        return 130
    except Exception as e:  # a failure while running: one line, the traceback on request
        if os.environ.get("DCNKIT_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0]
        print(f"{prog}: error: {type(e).__name__}: {first} (DCNKIT_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
    return int(rc or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
