"""Train, export and check a small DCNv2 classifier end to end on scikit-learn's digits.

``dcnkit demo [--out DIR]`` (or ``python -m dcnkit.demo``):

1. trains ``conv -> ModulatedDeformConv2dPack -> max-pool -> linear`` on the 8x8 digits bundled with
   scikit-learn (fixed seed, stratified 80/20 split; seconds on a CPU) and reports train/test accuracy;
2. exports it with ``dcnkit.export.to_onnx`` (dcnkit-domain nodes by default; ``--standard-ops`` for the
   standard ``DeformConv``, which ONNX Runtime also runs on the kit's kernel through ``ort_session``'s in-memory
   rewrite unless ``--no-kit-kernels``);
3. runs the test set in ONNX Runtime with the kit's library and reports its accuracy;
4. compares backends with Polygraphy: ort-cpu vs the NumPy reference runner, plus ort-cuda / tensorrt when
   present (else one line "skipped: reason"), and prints the largest output differences.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from dcnkit._progress import progress


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="dcnkit-demo", help="folder for the artifacts (default ./dcnkit-demo)")
    p.add_argument("--epochs", type=int, default=15, help="training epochs (default 15)")
    p.add_argument("--batch-size", type=int, default=64, help="training batch size (default 64)")
    p.add_argument("--lr", type=float, default=3e-3, help="Adam learning rate (default 3e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the split, the init and the shuffling (default 0)")
    p.add_argument("--train-fraction", type=float, default=1.0,
                   help="use this fraction of the training split (default 1; tests use less)")
    p.add_argument("--reference-samples", type=int, default=32,
                   help="test images compared against the slow NumPy reference runner (default 32)")
    p.add_argument("--standard-ops", action="store_true",
                   help="export the standard ONNX DeformConv instead of the dcnkit-domain DeformConv2d")
    p.add_argument("--no-kit-kernels", dest="kit_kernels", action="store_false",
                   help="with --standard-ops: run DeformConv on ONNX Runtime's built-in kernel, not the kit's")
    p.add_argument("--atol", type=float, default=1e-4, help="comparison tolerance (absolute, default 1e-4)")
    p.add_argument("--rtol", type=float, default=1e-4, help="comparison tolerance (relative, default 1e-4)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads for training (default 1: tiny batches gain little from more, and "
                   "OpenMP threads on busy shared cores can be many times slower)")


def build_model(channels: int = 16):
    import torch.nn as nn

    from dcnkit.nn import ModulatedDeformConv2dPack

    return nn.Sequential(
        nn.Conv2d(1, channels, 3, padding=1),
        nn.ReLU(),
        ModulatedDeformConv2dPack(channels, 2 * channels, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * channels * 16, 10),
    )


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test): images (N, 1, 8, 8) float32 in [-1, 1], labels int64."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 8.0 - 1.0)[:, None]
    y = d.target.astype(np.int64)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return x_tr, y_tr, x_te, y_te


def train(model, x, y, epochs: int, batch_size: int, lr: float, seed: int, log=print):
    import torch

    g = torch.Generator().manual_seed(seed)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(epochs, 1))
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    bar = progress(range(epochs), desc="train", unit="epoch")
    for _ in bar:
        perm = torch.randperm(len(xt), generator=g)
        total = 0.0
        for i in range(0, len(xt), batch_size):
            idx = perm[i:i + batch_size]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        sched.step()
        if hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{total / len(xt):.4f}")
    model.eval()
    return model


def torch_logits(model, x: np.ndarray) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(x)).numpy()


def run_demo(out: str | Path = "dcnkit-demo", epochs: int = 15, batch_size: int = 64, lr: float = 3e-3,
             seed: int = 0, train_fraction: float = 1.0, reference_samples: int = 32, standard_ops: bool = False,
             atol: float = 1e-4, rtol: float = 1e-4, threads: int | None = 1, log=print,
             kit_kernels: bool = True) -> dict:
    """The whole demo; returns a summary dict (also written to ``out/summary.json``)."""
    import torch

    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run_demo(out, epochs, batch_size, lr, seed, train_fraction, reference_samples, standard_ops,
                         atol, rtol, log, kit_kernels)
    finally:
        torch.set_num_threads(old_threads)


def _run_demo(out, epochs, batch_size, lr, seed, train_fraction, reference_samples, standard_ops, atol, rtol,
              log, kit_kernels=True) -> dict:
    import torch

    import dcnkit.export as dk_export
    from dcnkit.polygraphy_ext import compare_backends
    from dcnkit.runtime.registry import available_backends, make_runner

    t_start = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    np.random.seed(seed)
    torch.manual_seed(seed)

    x_tr, y_tr, x_te, y_te = load_digits_split(seed)
    if train_fraction < 1.0:
        n = max(int(len(x_tr) * train_fraction), 10)
        x_tr, y_tr = x_tr[:n], y_tr[:n]
    log(f"digits: {len(x_tr)} train / {len(x_te)} test images (8x8), seed {seed}")

    model = build_model()
    t0 = time.perf_counter()
    train(model, x_tr, y_tr, epochs, batch_size, lr, seed, log)
    t_train = time.perf_counter() - t0
    train_acc = float((torch_logits(model, x_tr).argmax(1) == y_tr).mean())
    logits_pt = torch_logits(model, x_te)
    test_acc_pt = float((logits_pt.argmax(1) == y_te).mean())
    log(f"PyTorch: train accuracy {train_acc:.4f}, test accuracy {test_acc_pt:.4f} ({epochs} epochs, {t_train:.1f} s)")
    torch.save(model.state_dict(), out / "model.pt")

    onnx_path = out / "dcn_digits.onnx"
    t0 = time.perf_counter()
    dk_export.to_onnx(model, (torch.from_numpy(x_te[:2]),), str(onnx_path), standard_ops=standard_ops,
                      dynamic_batch=True, verbose=False)
    import onnx

    proto = onnx.load(str(onnx_path))
    dcn_nodes = [f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in proto.graph.node
                 if n.op_type in ("DeformConv2d", "DeformConv")]
    log(f"exported {onnx_path} ({', '.join(dcn_nodes) or 'no deformable node!'}) in {time.perf_counter() - t0:.1f} s")

    with make_runner(onnx_path, "ort-cpu", kit_kernels=kit_kernels) as ort_runner:
        name = ort_runner.inputs()[0].name
        out_name = ort_runner.outputs()[0].name
        logits_ort = ort_runner.run({name: x_te})[out_name]
    test_acc_ort = float((logits_ort.argmax(1) == y_te).mean())
    diff_pt_ort = float(np.abs(logits_ort - logits_pt).max())
    if any(d.startswith("dcnkit::") for d in dcn_nodes):
        where = "kit's library"
    else:
        where = "kit's kernel, DeformConv rewritten in memory" if kit_kernels else "built-in DeformConv"
    log(f"ONNX Runtime ({where}): test accuracy {test_acc_ort:.4f}; "
        f"largest |PyTorch - ORT| logit difference {diff_pt_ort:.3g}")

    avail = available_backends()
    backends = ["ort-cpu"]
    skipped = {}
    for b in ("ort-cuda", "tensorrt"):
        if avail[b] is None:
            backends.append(b)
        else:
            skipped[b] = avail[b]
            log(f"{b}: skipped: {avail[b]}")
    backends.append("reference")
    n_ref = max(1, min(reference_samples, len(x_te)))
    t0 = time.perf_counter()
    passed, stats, _ = compare_backends(onnx_path, backends, [{name: x_te[:n_ref]}], atol=atol, rtol=rtol)
    t_cmp = time.perf_counter() - t0
    log(f"Polygraphy comparison on {n_ref} test images ({t_cmp:.1f} s), vs ort-cpu:")
    for r in stats:
        log(f"  {r['runner']:<10} {r['output']}: max abs diff {r.get('max_abs', float('nan')):.3g}, "
            f"mean abs {r.get('mean_abs', float('nan')):.3g}, max rel {r.get('max_rel', float('nan')):.3g}")
    largest = max([diff_pt_ort] + [r.get("max_abs", 0.0) for r in stats])
    log(f"{'PASSED' if passed else 'FAILED'} (atol={atol:g}, rtol={rtol:g}); largest output difference {largest:.3g}")

    summary = dict(
        train_images=len(x_tr), test_images=len(x_te), epochs=epochs, seed=seed,
        train_accuracy=train_acc, test_accuracy_torch=test_acc_pt, test_accuracy_ort=test_acc_ort,
        max_abs_diff_torch_ort=diff_pt_ort, compared_backends=backends, skipped=skipped,
        comparison=stats, comparison_passed=bool(passed), largest_difference=largest,
        onnx=str(onnx_path), deformable_nodes=dcn_nodes, ort_deform_conv_kernel=where,
        seconds=time.perf_counter() - t_start,
    )
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    log(f"artifacts in {out} ({summary['seconds']:.1f} s in all)")
    return summary


def check_arguments(args) -> None:
    """ValueError (``--option: expected ..., got ...``) for options out of range."""
    if args.epochs < 1:
        raise ValueError(f"--epochs: expected >= 1, got {args.epochs}")
    if not 0 < args.train_fraction <= 1:
        raise ValueError(f"--train-fraction: expected a value in (0, 1], got {args.train_fraction}")


def main_from_args(args) -> int:
    """The demo for parsed arguments (:func:`add_arguments`); exit code 0 when the backends agree."""
    check_arguments(args)
    s = run_demo(out=args.out, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
                 train_fraction=args.train_fraction, reference_samples=args.reference_samples,
                 standard_ops=args.standard_ops, atol=args.atol, rtol=args.rtol, threads=args.threads,
                 kit_kernels=args.kit_kernels)
    return 0 if s["comparison_passed"] else 1


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m dcnkit.demo", description=__doc__.strip().splitlines()[0])
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        check_arguments(args)
    except ValueError as e:
        p.error(str(e))
    return main_from_args(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
