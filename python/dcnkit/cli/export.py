"""``dcnkit export MODULE:FACTORY -o m.onnx --input SPEC ...``: build a PyTorch model with a factory, optionally
load a checkpoint, export it with :func:`dcnkit.export.to_onnx`."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path

import numpy as np

from dcnkit.cli.feeds import SPEC_HELP, parse_input_spec, random_array, random_rois
from dcnkit.cli.shared import CliError, progress


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
    steps = progress(total=3, desc="export", unit="step")

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
                   "MultiLevelRoIAlign")})
    print(f"exported {out} ({out.stat().st_size / 1024:.1f} KiB, {len(m.graph.node)} nodes"
          + (", " + ", ".join(f"{d}::{t}" for d, t in ops) if ops else "") + ")")
    return 0


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
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
