"""``dcnkit compare m.onnx --backends a,b``: the model on several backends through Polygraphy's Comparator, each
checked against the first within ``--atol`` / ``--rtol``; exit code 1 when they differ."""
from __future__ import annotations

import numpy as np

from dcnkit.cli.backend_args import FAST_BACKENDS, parse_backends, require_backends
from dcnkit.cli.compare_detections import add_args as add_detection_args
from dcnkit.cli.compare_detections import compare_detections
from dcnkit.cli.feeds import add_input_args, feeds_for, make_feeds, parse_input_spec
from dcnkit.cli.shared import CliError, check_model_path
from dcnkit.cli.tolerances import (
    DEFAULT_TOL,
    check_tolerance_names,
    format_tolerances,
    model_output_names,
    parse_tolerances,
)


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


def cmd_compare(args) -> int:
    from dcnkit.polygraphy_ext import compare_backends
    from dcnkit.runtime.registry import available_backends, make_runner

    check_model_path(args.model)
    requested = parse_backends(args.backends)
    from dcnkit.runtime.tensorrt import is_engine_file

    if is_engine_file(args.model):
        raise CliError("model", f"expected the ONNX file (every backend runs it; tensorrt builds it), got {args.model!r}")
    atol = parse_tolerances(args.atol, "--atol", DEFAULT_TOL)
    rtol = parse_tolerances(args.rtol, "--rtol", DEFAULT_TOL)
    if len(atol) > 1 or len(rtol) > 1:
        outputs = model_output_names(args.model)
        check_tolerance_names(atol, outputs, "--atol")
        check_tolerance_names(rtol, outputs, "--rtol")
    avail = available_backends()
    require_backends(requested, avail)
    chosen, skipped = choose_compare_backends(requested, avail)
    for line in skipped:
        print(line)
    if len(chosen) < 2:
        raise CliError("--backends", f"expected at least two usable backends, got {chosen}")
    with make_runner(args.model, "reference") as r:
        infos = r.inputs()
    rng_feeds = []
    if args.inputs:
        rng_feeds = [feeds_for(args, infos)]
    else:
        for i in range(args.iterations):
            args_seed = args.seed + i
            specs = {s.name: s for s in (parse_input_spec(t, "--shape") for t in args.shape or [])}
            rng_feeds.append(make_feeds(infos, specs, np.random.default_rng(args_seed), batch=args.batch))
    print(f"comparing {', '.join(chosen)} on {args.model} ({len(rng_feeds)} input set(s); "
          f"{format_tolerances(atol, rtol)})")
    if args.detections:
        return compare_detections(args, args.model, chosen, rng_feeds, atol, rtol, model_output_names(args.model))
    passed, stats, _ = compare_backends(args.model, chosen, rng_feeds, atol=atol, rtol=rtol,
                                        quiet=not args.verbose)
    for line in format_stats(stats):
        print(line)
    print("PASSED" if passed else "FAILED: outputs differ beyond atol/rtol")
    return 0 if passed else 1


def register(sub) -> None:
    """Adds the command to the CLI's subparsers."""
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
    add_detection_args(p)
    add_input_args(p)
    p.set_defaults(func=cmd_compare)
