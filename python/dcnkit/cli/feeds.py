"""Model inputs for the commands: ``--input`` / ``--shape`` specifications (``NAME:SHAPE[:DTYPE[LOW,HIGH]]``,
``NAME:rois:K``), random feeds of a model's shapes (valid RoIs and batch indices), and ``--inputs`` .npz files."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from dcnkit.cli.shared import CliError

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


def feeds_for(args, infos) -> dict:
    """The feeds a command runs: ``--inputs`` (an .npz with every input) or random ones (``--shape``, ``--batch``,
    ``--seed``)."""
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


def add_input_args(p, with_batch=True):
    """``--inputs``, ``--shape``, ``--batch`` and ``--seed`` (run, compare, bench)."""
    p.add_argument("--inputs", metavar="NPZ", help="input arrays (.npz, one array per model input)")
    p.add_argument("--shape", action="append", metavar="SPEC",
                   help="shape (and dtype) of a random input, needed for symbolic dims; " + SPEC_HELP)
    if with_batch:
        p.add_argument("--batch", type=int, default=1, help="value of a symbolic first (batch) dim (default 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default 0)")
