"""``--atol`` / ``--rtol`` as Polygraphy takes them (``VALUE`` or ``OUTPUT:VALUE``), checked against a model's
outputs, and shown in one line."""
from __future__ import annotations

from dcnkit.cli.shared import CliError

DEFAULT_TOL = 1e-4


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


def model_output_names(path: str) -> list[str]:
    import onnx

    return [o.name for o in onnx.load(str(path), load_external_data=False).graph.output]
