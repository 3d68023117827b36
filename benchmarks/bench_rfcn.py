"""Benchmark: the deformable R-FCN head (examples/rfcn_dcn.py) in ONNX Runtime on the CPU vs PyTorch eager, in one run.

    python benchmarks/bench_rfcn.py [--threads 2] [--repeat 15] [--image-size 512] [--rois 300] [--classes 21]

The head of the authors' R-FCN: ``conv_new_1`` (2048 -> 1024, ReLU), the position-sensitive score and box maps and
both offset maps (1x1 convolutions), the first DeformPSRoIPool pass without offsets (output_dim 2·(C+1) and 2)
and the deformable second pass (output_dim C+1 and 8, trans_std 0.1), k = 7, sample_per_part 4, spatial_scale
1/16, and the votes (means over the 7x7 bins). Its input: ``layer4``'s features of an image of ``--image-size``
(stride 16; random, rectified) and ``--rois`` random boxes (the authors test with 300 proposals; 21 classes with the
background: PASCAL VOC). Weights from a fixed seed, the offset convolutions' small and random. The head is
exported alone (dynamic batch and RoI count) and ONNX Runtime's outputs are checked against eager first; the two
then run interleaved, round after round, each reporting its fastest round. Also printed: where ONNX Runtime's
time goes (its profiler, one run), the four DeformPSRoIPool nodes against the convolutions.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import _common as C  # noqa: E402
from bench_roi_align import make_rois  # noqa: E402


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    C.add_common_args(ap)
    ap.add_argument("--image-size", type=int, default=512, help="image side; the features are 1/16 of it")
    ap.add_argument("--rois", type=int, default=300)
    ap.add_argument("--classes", type=int, default=21, help="classes with the background (default 21, VOC)")
    args = ap.parse_args(argv)
    dev = C.resolve_device(args)
    if dev != "cpu":
        raise SystemExit(f"--device: expected cpu (the head's ONNX Runtime CPU vs eager CPU row), got {dev}")
    import onnxruntime as ort
    import torch

    import rfcn_dcn as ex
    from dcnkit.runtime import ort_session

    size, k, classes, mid = args.image_size, args.rois, args.classes, 1024
    in_channels = 2048
    if args.quick:
        size, k, classes, mid, in_channels = 64, 8, 3, 16, 32
    torch.manual_seed(0)
    head = ex.RFCNHead(in_channels, classes, mid_channels=mid).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():  # outputs of about unit size, offsets of about a tenth
        for conv, scale in ((head.rfcn_cls, 1.0), (head.rfcn_bbox, 1.0), (head.rfcn_cls_offset_t, 0.1),
                            (head.rfcn_bbox_offset_t, 0.1)):
            conv.weight.normal_(std=scale / conv.weight[0].numel() ** 0.5, generator=gen)
    features = torch.randn(1, in_channels, size // 16, size // 16, generator=gen).relu()
    rois = make_rois(k, 1, float(size), gen, "cpu")
    path = ex.export_head(head, features, rois, Path(tempfile.mkdtemp()) / "rfcn_head.onnx")
    nodes = ex.psroi_nodes(path)
    sess = ort_session(str(path), providers=["CPUExecutionProvider"], intra_op_num_threads=args.threads,
                       inter_op_num_threads=1, session_config=C.NO_SPIN)
    feeds = {"features": features.numpy(), "rois": rois.numpy()}
    with torch.inference_mode():
        want = head(features, rois)
    accuracy = [C.check_accuracy(f"ORT vs eager, {name}", got, w)
                for name, got, w in zip(("class_logits", "box_deltas"), sess.run(None, feeds), want)]

    def eager():
        with torch.inference_mode():
            return head(features, rois)

    ms = C.interleaved({"ort": C.ort_call(sess, feeds), "eager": eager}, args.repeat, args.warmup)
    profile = C.ort_profile(path, feeds, args.threads)
    psroi_ms = profile.get("DeformPSRoIPool", 0.0)
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, {args.threads} threads, fastest of "
          f"{args.repeat} interleaved rounds (after {args.warmup} warm-up)")
    print(f"R-FCN head: features (1, {in_channels}, {size // 16}, {size // 16}) (image {size}x{size}), {k} RoIs, "
          f"{classes} classes, {len(nodes)} DeformPSRoIPool nodes (output_dim, offsets) {nodes}")
    C.print_table(["case", "ORT CPU ms", "eager CPU ms", "ORT / eager"],
                  [["R-FCN head (both DeformPSRoIPool passes)", f"{ms['ort']:.2f}", f"{ms['eager']:.2f}",
                    f"{ms['ort'] / ms['eager']:.2f}"]])
    top = ", ".join(f"{op} {v:.2f}" for op, v in list(profile.items())[:5])
    print(f"ORT profile (ms, one run): {top}")
    result = {"device": dev, "threads": args.threads, "image_size": size, "rois": k, "classes": classes,
              "psroi_nodes": nodes, "ms": ms, "ort_over_eager": ms["ort"] / ms["eager"], "profile_ms": profile,
              "psroi_ms_in_ort": psroi_ms, "accuracy": accuracy}
    return C.write_json(args, result)


if __name__ == "__main__":
    main()
