"""What every command of the CLI shares: :class:`CliError` (a bad argument: one line, exit code 2), progress
bars, and the check of a model path. Commands import this module; it imports no command."""
from __future__ import annotations

from pathlib import Path

from dcnkit._progress import progress  # noqa: F401  (the commands' progress bars)


class CliError(Exception):
    """An error in the command line: ``arg`` names the argument; exit code 2."""

    def __init__(self, arg: str, message: str):
        super().__init__(f"{arg}: {message}")
        self.arg = arg


def check_model_path(path: str, arg: str = "model") -> str:
    """``path`` when it is an existing file, else CliError naming ``arg``."""
    if not Path(path).is_file():
        raise CliError(arg, f"expected an existing ONNX file, got {path!r}")
    return path


def cli_error_from(e: Exception) -> CliError:
    """CliError from an exception whose message reads ``ARG: MESSAGE`` (the tools' argument errors)."""
    arg, _, msg = str(e).partition(": ")
    return CliError(arg, msg)
