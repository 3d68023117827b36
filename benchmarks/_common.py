"""What the benchmark scripts share: device choice, interleaved timing, peak-memory measurement, tables.

Timing: the implementations of one case are run in turn, round after round (interleaved, so that a burst of
load from other work on a shared machine hits all of them alike), and each reports the fastest of its rounds.
``--clock cpu`` measures the process's CPU time instead of elapsed time (with ``--threads 1``: the work done,
much less disturbed by other processes than elapsed time on a busy machine).
Memory: the peak memory a call allocates beyond what existed before it (its outputs, gradients, workspaces and
temporaries): ``torch.cuda.max_memory_allocated`` on CUDA; on the CPU the process's resident-set high-water mark
(``VmHWM``, reset through ``/proc/self/clear_refs`` before each call) minus its resident set before the call,
with glibc's malloc told to return every block above 64 KiB to the system at once (``MALLOC_MMAP_THRESHOLD_``,
set by :func:`reexec_for_cpu_memory` before torch is imported), so that freed memory is not reused unseen.
"""
from __future__ import annotations

import gc
import os
import sys
import time
from collections.abc import Callable

MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
_clock = time.perf_counter  # --clock cpu: time.process_time


def reexec_for_cpu_memory() -> None:
    """Restarts this script with glibc's mmap threshold fixed at 64 KiB (once; before torch is imported), so
    that the CPU memory figures see every large allocation and free."""
    if sys.platform.startswith("linux") and os.environ.get(MMAP_ENV) is None:
        env = dict(os.environ, **{MMAP_ENV: "65536", "MALLOC_TRIM_THRESHOLD_": "65536"})
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def default_device() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:  # pragma: no cover
        return "cpu"


def add_common_args(ap, repeat: int = 15) -> None:
    ap.add_argument("--device", choices=["cpu", "cuda"], default=None,
                    help="cpu or cuda (default: cuda when a GPU is available)")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads: torch.set_num_threads and ONNX Runtime "
                    "intra-op threads (default 2)")
    ap.add_argument("--repeat", type=int, default=repeat, help=f"timed rounds; the fastest counts (default {repeat})")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall: elapsed time (default); cpu: this process's CPU time, steadier on a machine shared "
                    "with other work (use it with --threads 1, where CPU time is the work done)")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and 1 round: checks that the script runs")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")


# ``ort_session(..., session_config=NO_SPIN)``: ONNX Runtime's idle intra-op threads block instead of spinning, so that
# sessions (and PyTorch) timed in turn in one process do not rob each other's cores.
NO_SPIN = {"session.intra_op.allow_spinning": "0"}


def add_no_spin_arg(ap) -> None:
    ap.add_argument("--spin", action="store_true",
                    help="let idle threads spin (ONNX Runtime's default and OpenMP's); by default they block "
                    "(session.intra_op.allow_spinning=0, OMP_WAIT_POLICY=PASSIVE), so that sessions timed in turn "
                    "do not rob each other's cores")
    ap.add_argument("--no-spin", action="store_true", help="the default (kept for the documented commands)")


def no_spin_options(args) -> dict:
    """Unless ``--spin``: sets OMP_WAIT_POLICY=PASSIVE (call before torch is imported) and returns the
    ``ort_session`` keyword that turns ONNX Runtime's spinning off; with ``--spin``, {}."""
    if getattr(args, "spin", False):
        return {}
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return {"session_config": dict(NO_SPIN)}


def resolve_device(args) -> str:
    import torch

    dev = args.device or default_device()
    if dev == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: expected a CUDA device, got none (torch.cuda.is_available() is False)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.repeat, args.warmup = 1, 0
    global _clock
    _clock = time.process_time if getattr(args, "clock", "wall") == "cpu" else time.perf_counter
    return dev


def synchronizer(device: str) -> Callable[[], None]:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.synchronize
    return lambda: None


def interleaved(fns: dict[str, Callable[[], object]], repeat: int, warmup: int, sync=lambda: None) -> dict:
    """Milliseconds per implementation: the fastest of ``repeat`` interleaved rounds after ``warmup``."""
    for _ in range(warmup):
        for f in fns.values():
            f()
    sync()
    best = {k: float("inf") for k in fns}
    for _ in range(max(1, repeat)):
        for k, f in fns.items():
            sync()
            t0 = _clock()
            f()
            sync()
            best[k] = min(best[k], (_clock() - t0) * 1e3)
    return best


def _proc_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def cpu_memory_supported() -> bool:
    return sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs")


def peak_extra_bytes(fn: Callable[[], object], device: str) -> int | None:
    """Peak bytes allocated while ``fn()`` runs beyond those allocated before (results are dropped after)."""
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        del out
        return int(peak)
    if not cpu_memory_supported():
        return None
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident set
    except OSError:
        return None
    base = _proc_kib("VmRSS")
    out = fn()
    peak = _proc_kib("VmHWM") - base
    del out
    return max(0, peak) * 1024


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:.1f}"


def write_json(args, result, default=None):
    """Writes ``result`` to ``--json`` when given (``default``: json.dump's, for values it cannot write); returns it."""
    if args.json:
        import json

        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=default)
    return result


def print_table(header: list[str], rows: list[list], widths: list[int] | None = None) -> None:
    """A Markdown table (copy-paste into the README)."""
    cells = [[str(c) for c in r] for r in rows]
    widths = widths or [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(header)]
    line = "| " + " | ".join(h.ljust(w) for h, w in zip(header, widths)) + " |"
    print(line)
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))) + " |",
              flush=True)


def tensorrt_available() -> str | None:
    """None when TensorRT engines can be built here (tensorrt importable, the kit's plugin library built, a GPU),
    else the reason."""
    try:
        import tensorrt  # noqa: F401
    except ImportError as e:
        return f"tensorrt is not importable ({e})"
    try:
        import dcnkit

        dcnkit.tensorrt_library()
    except FileNotFoundError:
        return "libdcnkit_trt.so was not built"
    if default_device() != "cuda":
        return "no CUDA device"
    return None


def time_tensorrt(model, feeds: dict, repeat: int, warmup: int) -> float:
    """Milliseconds per inference of a TensorRT engine built from ``model`` (path or bytes) with the kit's
    plugins (dcnkit.runtime.tensorrt), fastest of ``repeat``."""
    from dcnkit.runtime.tensorrt import TensorRTRunner

    with TensorRTRunner(model) as runner:
        return interleaved({"trt": lambda: runner.run(feeds)}, repeat, warmup)["trt"]


# Accuracy of a benchmark's implementations against its reference, relative to the reference's largest magnitude
# (at least 1): what each dtype's / math mode's rounding allows. float32 sums in another order (GPU atomics, other
# blockings) differ by ~1e-6 relative; TF32 GEMMs / convolutions (ONNX Runtime's CUDA EP and cuDNN by default) keep
# 10 mantissa bits; float16 / bfloat16 storage 11 / 8 bits. A difference within the tolerance is reported, not an
# error; only a gross mismatch (a wrong result, not rounding) stops the benchmark.
TOLERANCE = {"float64": 1e-9, "float32": 1e-4, "tf32": 1e-2, "float16": 1e-2, "bfloat16": 5e-2}


def check_accuracy(name: str, got, want, precision: str = "float32") -> dict:
    """Prints and returns ``{name, precision, max_abs_diff, scale, tolerance, ok}`` for ``got`` vs ``want``
    (NumPy arrays or tensors); raises SystemExit only when the difference exceeds the precision's tolerance."""
    import numpy as np

    def arr(a):
        if hasattr(a, "detach"):
            a = a.detach().float().cpu().numpy()
        return np.asarray(a, dtype=np.float64)

    g, w = arr(got), arr(want)
    if g.shape != w.shape:
        raise SystemExit(f"accuracy {name}: shape {g.shape} vs the reference's {w.shape}")
    scale = max(1.0, float(np.abs(w).max()) if w.size else 0.0)
    err = float(np.abs(g - w).max()) if w.size else 0.0
    tol = TOLERANCE[precision]
    ok = bool(err <= tol * scale) and bool(np.isfinite(g).all() == np.isfinite(w).all())
    print(f"accuracy {name} [{precision}]: max |diff| {err:.3g} (scale {scale:.3g}, tolerance {tol:g} x scale): "
          + ("ok" if ok else "MISMATCH"))
    if not ok:
        raise SystemExit(f"accuracy {name} [{precision}]: max |diff| {err:.3g} exceeds {tol:g} x {scale:.3g}: a wrong "
                         f"result, not rounding")
    return {"name": name, "precision": precision, "max_abs_diff": err, "scale": scale, "tolerance": tol, "ok": ok}


def ort_providers(device: str, tf32: bool = False) -> list:
    """ONNX Runtime providers for ``device``: the CUDA EP (TF32 off unless asked, so float32 kernels are exact)
    when onnxruntime has it, else the CPU EP (with a line saying so)."""
    if device == "cuda":
        from dcnkit.runtime.ort import cuda_provider_available

        if cuda_provider_available():
            return [("CUDAExecutionProvider", {"use_tf32": "1" if tf32 else "0"}), "CPUExecutionProvider"]
        print("ONNX Runtime: no CUDA execution provider (install onnxruntime-gpu): its sessions run on the CPU")
    return ["CPUExecutionProvider"]


def ort_profile(path, feeds: dict, threads: int) -> dict:
    """Milliseconds per op type of one run of the model at ``path`` in ONNX Runtime on the CPU (its profiler; the
    second of two runs), largest first."""
    import json
    import tempfile

    from dcnkit.runtime import ort_session

    d = tempfile.mkdtemp()
    sess = ort_session(str(path), providers=["CPUExecutionProvider"], intra_op_num_threads=threads,
                       inter_op_num_threads=1, enable_profiling=True, profile_file_prefix=os.path.join(d, "p"))
    sess.run(None, feeds)
    sess.run(None, feeds)
    with open(sess.end_profiling()) as fh:
        events = json.load(fh)
    runs = [e for e in events if e.get("name") == "model_run"]
    t_from = runs[-1]["ts"] if runs else 0
    per: dict = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= t_from:
            op = e.get("args", {}).get("op_name", "?")
            per[op] = per.get(op, 0.0) + e["dur"] / 1e3
    return dict(sorted(per.items(), key=lambda kv: -kv[1]))


def ort_call(sess, feeds: dict) -> Callable[[], object]:
    """A zero-argument call running ``sess`` on ``feeds`` for timing. On the CUDA EP with IO binding: the inputs
    are copied to the GPU once and the outputs stay there, so the time is the session's, not host<->device
    copies (ONNX Runtime's run returns when its stream is done)."""
    if "CUDAExecutionProvider" not in sess.get_providers():
        return lambda: sess.run(None, feeds)
    import onnxruntime as ort

    binding = sess.io_binding()
    on_device = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
    for k, v in on_device.items():
        binding.bind_ortvalue_input(k, v)
    for o in sess.get_outputs():
        binding.bind_output(o.name, "cuda", 0)

    def run():
        sess.run_with_iobinding(binding)
        return on_device  # keeps the bound inputs alive with the call

    return run
