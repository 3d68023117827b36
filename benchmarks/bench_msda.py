"""Multi-scale deformable attention timings: dcnkit's fused op vs the grid_sample formulation (what users run
without a compiled op, mmcv's ``multi_scale_deformable_attn_pytorch`` way), in PyTorch and in ONNX Runtime.

    python benchmarks/bench_msda.py [--device cpu|cuda] [--threads 2] [--repeat 5] [--warmup 1]

Shape: Deformable DETR's encoder: N=2, 4 levels from 100x150 down (100x150, 50x75, 25x38, 13x19: S = 19947),
256 channels in 8 heads (D = 32), 4 points, one query per value row (Lq = S).

* PyTorch: ``dcnkit.ops.multi_scale_deformable_attn`` vs the grid_sample formulation (one ``grid_sample`` per
  level, weighted sum), forward and forward+backward (gradients of value, locations and weights);
* ONNX Runtime: the sampling exported as one ``dcnkit::MultiScaleDeformableAttention`` node vs the same
  formulation exported as ``GridSample`` nodes, both with the level tables as constants.

The implementations of a case run interleaved, round after round; each reports its fastest round.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

DETR_LEVELS = ((100, 150), (50, 75), (25, 38), (13, 19))


def grid_sample_attention(value, sizes, sampling_locations, attention_weights):
    """The formulation without a compiled op, with the level sizes as Python ints (so it exports as GridSample
    nodes): per level, grid_sample of the (N*M, D, H, W) map at 2*loc - 1, then the weighted sum."""
    import torch.nn.functional as F

    N, _, M, D = value.shape
    _, Lq, _, L, P, _ = sampling_locations.shape
    levels = value.split([h * w for h, w in sizes], dim=1)
    grids = 2 * sampling_locations - 1
    out = 0
    for lvl, (h, w) in enumerate(sizes):
        v = levels[lvl].permute(0, 2, 3, 1).reshape(N * M, D, h, w)
        g = grids[:, :, :, lvl].transpose(1, 2).reshape(N * M, Lq, P, 2)
        s = F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False)  # (N*M, D, Lq, P)
        a = attention_weights[:, :, :, lvl].transpose(1, 2).reshape(N * M, 1, Lq, P)
        out = out + (s * a).sum(-1)
    return out.view(N, M * D, Lq).transpose(1, 2)


def _modules(sizes, spatial_shapes, level_start_index):
    import torch

    from dcnkit.ops import multi_scale_deformable_attn

    class Fused(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("shapes", spatial_shapes)
            self.register_buffer("starts", level_start_index)

        def forward(self, value, locations, weights):
            return multi_scale_deformable_attn(value, self.shapes, self.starts, locations, weights)

    class GridSample(torch.nn.Module):
        def forward(self, value, locations, weights):
            return grid_sample_attention(value, sizes, locations, weights)

    return Fused().eval(), GridSample().eval()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap, repeat=5)
    ap.set_defaults(warmup=1)
    args = ap.parse_args(argv)
    dev = C.resolve_device(args)
    import numpy as np
    import onnx
    import torch

    import dcnkit.export
    from dcnkit.runtime import ort_session

    sizes = ((10, 15), (5, 8), (3, 4)) if args.quick else DETR_LEVELS
    N, M, D, P = (1, 2, 8, 2) if args.quick else (2, 8, 32, 4)
    L = len(sizes)
    areas = [h * w for h, w in sizes]
    S = Lq = sum(areas)
    shapes = torch.tensor(sizes, dtype=torch.int64, device=dev)
    starts = torch.tensor([sum(areas[:i]) for i in range(L)], dtype=torch.int64, device=dev)
    g = torch.Generator().manual_seed(0)
    value = torch.randn(N, S, M, D, generator=g).to(dev)
    loc = torch.rand(N, Lq, M, L, P, 2, generator=g).to(dev)
    attn = torch.rand(N, Lq, M, L, P, generator=g).softmax(-1).to(dev)
    fused, gs = _modules(sizes, shapes, starts)
    sync = C.synchronizer(dev)

    ref = fused(value, loc, attn)
    torch.testing.assert_close(gs(value, loc, attn), ref, rtol=1e-4, atol=1e-4)  # float32, two roundings
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    grad = torch.randn_like(ref)

    def fwd_bwd(m):
        def run():
            for t in leaves:
                t.grad = None
            m(*leaves).backward(grad)
        return run

    with torch.no_grad():
        ms_f = C.interleaved({"dcnkit": lambda: fused(value, loc, attn), "grid_sample": lambda: gs(value, loc, attn)},
                             args.repeat, args.warmup, sync)
    ms_fb = C.interleaved({"dcnkit": fwd_bwd(fused), "grid_sample": fwd_bwd(gs)}, args.repeat, args.warmup, sync)

    # ONNX Runtime: the fused node vs GridSample nodes (CPU execution provider).
    opts = dict(intra_op_num_threads=args.threads, inter_op_num_threads=1, session_config=C.NO_SPIN)
    feeds = {"value": value.cpu().numpy(), "locations": loc.cpu().numpy(), "weights": attn.cpu().numpy()}
    cpu_args = tuple(torch.from_numpy(v) for v in feeds.values())
    sessions = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, m in (("fused node", _modules(sizes, shapes.cpu(), starts.cpu())[0]), ("GridSample nodes", gs)):
            path = os.path.join(tmp, name.replace(" ", "_") + ".onnx")
            dcnkit.export.to_onnx(m, cpu_args, path, dynamic_batch=False, input_names=list(feeds), dynamo=False)
            types = {n.op_type for n in onnx.load(path).graph.node}
            assert ("MultiScaleDeformableAttention" in types) == (name == "fused node"), types
            assert ("GridSample" in types) == (name == "GridSample nodes"), types
            sessions[name] = ort_session(path, providers=["CPUExecutionProvider"], **opts)
    expected = ref.cpu().numpy()
    for name, s in sessions.items():
        C.check_accuracy(f"ORT {name} vs dcnkit, {dev}", s.run(None, feeds)[0], expected)
    ms_ort = C.interleaved({k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()}, args.repeat,
                           args.warmup)

    print(f"device {dev}, {args.threads} threads, fastest of {args.repeat} interleaved rounds (after {args.warmup} "
          f"warm-up); value ({N}, {S}, {M}, {D}), levels {' '.join(f'{h}x{w}' for h, w in sizes)}, "
          f"Lq = {Lq}, {P} points")
    rows = [
        ["PyTorch forward", ms_f["dcnkit"], ms_f["grid_sample"]],
        ["PyTorch forward+backward", ms_fb["dcnkit"], ms_fb["grid_sample"]],
        ["ONNX Runtime (CPU EP) forward", ms_ort["fused node"], ms_ort["GridSample nodes"]],
    ]
    C.print_table(["case", "dcnkit ms", "grid_sample ms", "dcnkit / grid_sample"],
                  [[r[0], f"{r[1]:.1f}", f"{r[2]:.1f}", f"{r[1] / r[2]:.2f}"] for r in rows])
    result = {"device": dev, "threads": args.threads, "shape": {"N": N, "S": S, "M": M, "D": D, "L": L, "P": P,
                                                                "Lq": Lq, "levels": [list(s) for s in sizes]},
              "rows": [dict(case=r[0], dcnkit_ms=r[1], grid_sample_ms=r[2], ratio=r[1] / r[2]) for r in rows]}
    return C.write_json(args, result)


if __name__ == "__main__":
    main()
