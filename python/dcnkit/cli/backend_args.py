"""The ``--backend`` / ``--backends`` arguments of run, compare and bench: names checked against the registry,
backends that cannot run here reported in one line (exit code 1), runners made for a model file."""
from __future__ import annotations

from dcnkit.cli.shared import CliError

FAST_BACKENDS = ("ort-cpu", "ort-cuda", "tensorrt")


def parse_backends(text: str | None, arg: str = "--backends") -> list[str] | None:
    """``--backends a,b``: known names, each once (None when not given)."""
    from dcnkit.runtime.registry import BACKENDS

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


def require_backends(requested, available) -> None:
    """Backends named on the command line must be able to run here (BackendUnavailable otherwise)."""
    from dcnkit.runtime.base import BackendUnavailable

    for b in requested or []:
        if available.get(b) is not None:
            raise BackendUnavailable(f"{b}: {available[b]}")


def make_runner_cli(model, backend, arg="--backend", kit_kernels=True, device=None):
    """A runner; a backend that cannot run here raises BackendUnavailable (main: one line, exit code 1).
    ``device`` (``--device``): the OpenVINO device of the openvino backend (None: CPU)."""
    from dcnkit.runtime.registry import make_runner
    from dcnkit.runtime.tensorrt import is_engine_file

    if is_engine_file(model) and backend != "tensorrt":
        raise CliError(arg, f"expected tensorrt for the engine file {str(model)!r}, got {backend!r}")
    return make_runner(model, backend, kit_kernels=kit_kernels, **device_options(backend, device))


def device_options(backend, device) -> dict:
    """The runner options ``--device`` gives ``backend`` ({} when not given)."""
    if device is None or backend != "openvino":
        return {}
    if not device.strip():
        raise CliError("--device", f"expected an OpenVINO device name (CPU, GPU, NPU, AUTO, ...), got {device!r}")
    return {"device": device.strip()}


def check_model_for(path, backends) -> None:
    """The model argument: an existing file, or (openvino only) a folder from ``dcnkit convert --to openvino``."""
    from pathlib import Path

    from dcnkit.cli.shared import check_model_path

    if list(backends or []) == ["openvino"] and (Path(path) / "model.xml").is_file():
        return
    check_model_path(path)


def add_device_arg(p):
    """``--device`` (the openvino backend)."""
    p.add_argument("--device", default=None,
                   help="openvino: the OpenVINO device (default CPU; GPU, NPU, AUTO, HETERO:... are passed to OpenVINO "
                        "untested: the kit's operations run on the CPU only); other backends ignore it")


def add_kit_kernels_arg(p):
    """``--no-kit-kernels`` (ONNX Runtime backends)."""
    p.add_argument("--no-kit-kernels", dest="kit_kernels", action="store_false",
                   help="ONNX Runtime: run standard DeformConv nodes on ONNX Runtime's built-in kernel (default: on "
                   "the kit's DeformConv2d kernel, an in-memory rewrite; the file is not changed)")
