"""A Deformable DETR-style detector from PyTorch to ONNX Runtime, end to end.

An encoder-decoder transformer built from ``dcnkit.nn.MultiScaleDeformableAttention`` (Zhu et al., Deformable
DETR): a small backbone stand-in (strided convolutions) gives 4 feature levels (strides 8, 16, 32, 64), each
projected to ``d_model`` (256); 6 encoder layers of multi-scale deformable self-attention over all levels'
pixels; 6 decoder layers (query self-attention, deformable cross-attention at reference points predicted from
the queries' embeddings); class and box heads. 8 heads, 4 levels, 4 points. Outputs ``logits`` (N, Q, classes)
and ``boxes`` (N, Q, 4: cx, cy, w, h in [0, 1]). It is exported whole with each exporter (every attention is one
``dcnkit::MultiScaleDeformableAttention`` node; the level tables, reference points and positional encodings are
constants of the graph, so the image size is fixed at build time; the batch is dynamic), then run with the kit's tools:

    python examples/deformable_detr.py --out /tmp/ddetr            # build, export x2, check, run, compare, serve

which does what these commands do (the factory ``build`` below works with ``dcnkit export`` too):

    dcnkit export examples/deformable_detr.py:build -o ddetr.onnx --input images:1x3x64x96
    dcnkit run ddetr.onnx --inputs image.npz -o out.npz
    dcnkit compare ddetr.onnx --inputs image.npz --backends ort-cpu,reference \\
        --atol logits:1e-4 --rtol logits:1e-3 --atol boxes:1e-5 --rtol boxes:1e-4
    dcnkit serve ddetr.onnx --port 8000

The detector is untrained (random weights from a fixed seed; the offset and attention-weight projections get
small random weights on top of mmcv's initialisation so that the sampling locations differ per query).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from faster_rcnn_dcn import _dcnkit, make_image, serve_and_query  # noqa: E402

OUTPUTS = ("logits", "boxes")
STRIDES = (8, 16, 32, 64)


def _conv_out(n: int) -> int:
    """Size after a 3x3 convolution of stride 2, padding 1."""
    return (n - 1) // 2 + 1


def level_sizes(height: int, width: int, levels: int = 4) -> list:
    """(H, W) of each level for an image of ``height`` x ``width``: 3 halvings to stride 8, then one per level."""
    h, w = height, width
    for _ in range(3):
        h, w = _conv_out(h), _conv_out(w)
    sizes = []
    for _ in range(levels):
        sizes.append((h, w))
        h, w = _conv_out(h), _conv_out(w)
    return sizes


def sine_position(h: int, w: int, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """DETR's normalised sine positional encoding of an h x w grid, (h * w, dim): dim/2 channels for y, for x."""
    half = dim // 2
    ys = (torch.arange(h, dtype=torch.float64) + 0.5) / h * 2 * math.pi
    xs = (torch.arange(w, dtype=torch.float64) + 0.5) / w * 2 * math.pi
    freq = temperature ** (2 * (torch.arange(half, dtype=torch.float64) // 2) / half)

    def enc(t):
        t = t[:, None] / freq
        return torch.stack([t[:, 0::2].sin(), t[:, 1::2].cos()], -1).flatten(1)

    py, px = enc(ys), enc(xs)
    return torch.cat([py[:, None].expand(h, w, half), px[None].expand(h, w, half)], -1).reshape(h * w, dim).float()


class Backbone(nn.Module):
    """A stand-in for a ResNet: strided 3x3 convolutions to stride 8, then one per level; each level projected
    to ``d_model`` channels (1x1 convolution + GroupNorm, as Deformable DETR's ``input_proj``)."""

    def __init__(self, d_model: int, levels: int = 4, width: int = 32):
        super().__init__()
        chans = [3, width // 2, width, width]
        self.stem = nn.Sequential(*[m for i in range(3) for m in (
            nn.Conv2d(chans[i], chans[i + 1], 3, 2, 1), nn.ReLU())])
        self.downs = nn.ModuleList(nn.Sequential(nn.Conv2d(width, width, 3, 2, 1), nn.ReLU())
                                   for _ in range(levels - 1))
        self.proj = nn.ModuleList(nn.Sequential(nn.Conv2d(width, d_model, 1), nn.GroupNorm(8, d_model))
                                  for _ in range(levels))

    def forward(self, images):
        x = self.stem(images)
        feats = [x]
        for down in self.downs:
            x = down(x)
            feats.append(x)
        return [proj(f) for proj, f in zip(self.proj, feats)]


def _ffn(d_model: int, d_ffn: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_model, d_ffn), nn.ReLU(), nn.Linear(d_ffn, d_model))


class EncoderLayer(nn.Module):
    """Deformable self-attention over all levels' pixels (post-norm), then an FFN."""

    def __init__(self, d_model, heads, levels, points, d_ffn):
        import dcnkit.nn

        super().__init__()
        self.attn = dcnkit.nn.MultiScaleDeformableAttention(d_model, heads, levels, points, dropout=0.0,
                                                            batch_first=True)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ffn = _ffn(d_model, d_ffn)

    def forward(self, src, pos, reference_points, shapes, starts):
        src = self.norm1(self.attn(src, query_pos=pos, reference_points=reference_points, spatial_shapes=shapes,
                                   level_start_index=starts))
        return self.norm2(src + self.ffn(src))


class SelfAttention(nn.Module):
    """Multi-head self-attention among the queries, (N, Q, C) -> (N, Q, C), written out in matmuls and a softmax
    (``nn.MultiheadAttention`` with ``batch_first`` does not export with the TorchScript exporter)."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qk = nn.Linear(d_model, 2 * d_model)
        self.v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, query_with_pos, value):
        n, q, c = value.shape
        split = (n, q, self.heads, c // self.heads)
        qq, kk = (t.reshape(split).transpose(1, 2) for t in self.qk(query_with_pos).chunk(2, -1))
        vv = self.v(value).reshape(split).transpose(1, 2)
        attn = (qq @ kk.transpose(-1, -2) * (c // self.heads) ** -0.5).softmax(-1)
        return self.out((attn @ vv).transpose(1, 2).reshape(n, q, c))


class DecoderLayer(nn.Module):
    """Self-attention among the queries, deformable cross-attention into the encoder's output at the queries'
    reference points, an FFN; each followed by a residual and a LayerNorm."""

    def __init__(self, d_model, heads, levels, points, d_ffn):
        import dcnkit.nn

        super().__init__()
        self.self_attn = SelfAttention(d_model, heads)
        self.cross_attn = dcnkit.nn.MultiScaleDeformableAttention(d_model, heads, levels, points, dropout=0.0,
                                                                  batch_first=True)
        self.norm1, self.norm2, self.norm3 = nn.LayerNorm(d_model), nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.ffn = _ffn(d_model, d_ffn)

    def forward(self, tgt, query_pos, memory, reference_points, shapes, starts):
        tgt = self.norm1(tgt + self.self_attn(tgt + query_pos, tgt))
        tgt = self.norm2(self.cross_attn(tgt, value=memory, query_pos=query_pos, reference_points=reference_points,
                                         spatial_shapes=shapes, level_start_index=starts))
        return self.norm3(tgt + self.ffn(tgt))


class DeformableDETR(nn.Module):
    """``forward(images (N, 3, H, W))`` -> ``(logits (N, Q, classes), boxes (N, Q, 4))`` for the image size
    given at construction (the level tables, encoder reference points and positional encodings are buffers)."""

    def __init__(self, image_size=(64, 96), d_model=256, heads=8, levels=4, points=4, encoder_layers=6,
                 decoder_layers=6, d_ffn=1024, queries=100, num_classes=5):
        super().__init__()
        sizes = level_sizes(*image_size, levels)
        self.backbone = Backbone(d_model, levels)
        self.level_embed = nn.Parameter(torch.randn(levels, d_model) * 0.1)
        self.register_buffer("spatial_shapes", torch.tensor(sizes, dtype=torch.int64))
        counts = [h * w for h, w in sizes]
        self.register_buffer("level_start_index", torch.tensor([0] + counts[:-1], dtype=torch.int64).cumsum(0))
        self.register_buffer("pos", torch.cat([sine_position(h, w, d_model) for h, w in sizes])[None])
        self.register_buffer("pixel_level", torch.repeat_interleave(torch.arange(levels), torch.tensor(counts)))
        centres = [torch.stack(torch.meshgrid((torch.arange(w) + 0.5) / w, (torch.arange(h) + 0.5) / h,
                                              indexing="xy"), -1).reshape(-1, 2) for h, w in sizes]
        # Every pixel attends to each level at its own normalised position (valid ratios 1: no padding).
        self.register_buffer("encoder_reference", torch.cat(centres)[None, :, None].expand(1, -1, levels, 2)
                             .contiguous())
        self.encoder = nn.ModuleList(EncoderLayer(d_model, heads, levels, points, d_ffn)
                                     for _ in range(encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(d_model, heads, levels, points, d_ffn)
                                     for _ in range(decoder_layers))
        self.query_embed = nn.Embedding(queries, 2 * d_model)
        self.reference = nn.Linear(d_model, 2)
        self.class_head = nn.Linear(d_model, num_classes)
        self.box_head = nn.Sequential(nn.Linear(d_model, d_model), nn.ReLU(), nn.Linear(d_model, d_model), nn.ReLU(),
                                      nn.Linear(d_model, 4))
        self.levels, self.image_size = levels, tuple(image_size)

    def forward(self, images):
        if not torch.jit.is_tracing() and (images.dim() != 4 or tuple(images.shape[-2:]) != self.image_size):
            raise ValueError(f"DeformableDETR: images: expected shape (N, 3, {self.image_size[0]}, "
                             f"{self.image_size[1]}) (the size given to build), got {tuple(images.shape)}")
        feats = self.backbone(images)
        n = images.shape[0]
        src = torch.cat([f.flatten(2).transpose(1, 2) for f in feats], 1)  # (N, S, C)
        pos = (self.pos + self.level_embed[self.pixel_level][None]).expand(n, -1, -1)
        ref = self.encoder_reference.expand(n, -1, -1, -1)
        for layer in self.encoder:
            src = layer(src, pos, ref, self.spatial_shapes, self.level_start_index)
        query_pos, tgt = self.query_embed.weight.chunk(2, -1)
        query_pos, tgt = query_pos[None].expand(n, -1, -1), tgt[None].expand(n, -1, -1)
        reference = self.reference(query_pos).sigmoid()  # (N, Q, 2)
        ref = reference[:, :, None].expand(-1, -1, self.levels, -1)
        for layer in self.decoder:
            tgt = layer(tgt, query_pos, src, ref, self.spatial_shapes, self.level_start_index)
        box = self.box_head(tgt)
        centre = box[..., :2] + torch.logit(reference, eps=1e-5)
        return self.class_head(tgt), torch.cat([centre, box[..., 2:]], -1).sigmoid()


def build(image_size=(64, 96), seed: int = 0, d_model: int = 256, heads: int = 8, levels: int = 4,
          points: int = 4, encoder_layers: int = 6, decoder_layers: int = 6, d_ffn: int | None = None,
          queries: int = 100, num_classes: int = 5, offset_scale: float = 0.05) -> DeformableDETR:
    """The detector in eval mode, deterministic for a ``seed``, for images of ``image_size`` (an int: square);
    ``d_ffn`` defaults to ``4 * d_model``. ``offset_scale``: the standard deviation of the random weights added
    to each attention's ``sampling_offsets`` and ``attention_weights`` projections (0: mmcv's initialisation
    alone, the same offsets for every query)."""
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    torch.manual_seed(seed)
    model = DeformableDETR(tuple(image_size), d_model, heads, levels, points, encoder_layers, decoder_layers,
                           d_ffn or 4 * d_model, queries, num_classes)
    import dcnkit.nn

    perturb(model, dcnkit.nn.MultiScaleDeformableAttention, ("sampling_offsets", "attention_weights"), offset_scale,
            seed + 1)
    return model.eval()


def perturb(model, module_type: type, projections, scale: float, seed: int) -> None:
    """Adds random weights (standard deviation ``scale``, from ``seed``) to the ``projections`` (attribute names of
    linear layers) of every ``module_type`` in ``model``: the published initialisations zero or tie them, which
    would leave the sampling untested."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, module_type):
                for name in projections:
                    lin = getattr(m, name)
                    lin.weight.add_(torch.randn(lin.weight.shape, generator=g) * scale)


def eager_outputs(model, image: np.ndarray, outputs=OUTPUTS) -> dict:
    with torch.no_grad():
        out = model(torch.from_numpy(image))
    return {k: v.numpy() for k, v in zip(outputs, out)}


def export(model, image: np.ndarray, path: Path, dynamo: bool = False, outputs=OUTPUTS) -> Path:
    """The whole model with the chosen exporter, input ``images``, outputs ``outputs`` (the detector's: ``logits``
    and ``boxes``); the batch is dynamic, the image size the one the model was built for."""
    import dcnkit.export

    with torch.no_grad():
        dcnkit.export.to_onnx(model, (torch.from_numpy(image),), path, dynamo=dynamo, dynamic_batch=True,
                              input_names=["images"], output_names=list(outputs))
    return path


def node_counts(path: Path) -> dict:
    import onnx

    counts: dict = {}
    for n in onnx.load(str(path), load_external_data=False).graph.node:
        key = f"{n.domain or 'ai.onnx'}::{n.op_type}"
        counts[key] = counts.get(key, 0) + 1
    return counts


def ort_outputs(path: Path, image: np.ndarray, providers=("CPUExecutionProvider",)) -> dict:
    from dcnkit.runtime import ort_session

    sess = ort_session(str(path), providers=list(providers))
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"images": image})))


TOLERANCES = dict(logits=(1e-4, 1e-3), boxes=(1e-5, 1e-4))  # (atol, rtol) of ORT / the reference vs eager


def check_outputs(got: dict, want: dict, scale: float = 1.0, tolerances=None) -> dict:
    """``got`` equal to eager ``want`` within ``tolerances`` (output -> (atol, rtol); default ``TOLERANCES``)
    times ``scale``; returns the largest differences."""
    diffs = {}
    for k, (atol, rtol) in (tolerances or TOLERANCES).items():
        np.testing.assert_allclose(got[k], want[k], atol=atol * scale, rtol=rtol * scale, err_msg=k)
        diffs[k] = float(np.abs(got[k] - want[k]).max())
    return diffs


def export_and_check(model, image: np.ndarray, want: dict, stem: Path, node: str, outputs=OUTPUTS,
                     tolerances=None) -> tuple:
    """Exports with each exporter (``<stem>_dynamo.onnx``, ``<stem>_torchscript.onnx``), counts the ``node``s
    (``domain::type``), checks ONNX Runtime on the CPU (and with the CUDA provider where it is present, ten times
    looser: other summation orders, TF32) against eager ``want``. Returns the report and the last file."""
    import onnxruntime as ort

    providers = ["CPUExecutionProvider"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    report: dict = {}
    for dynamo in (True, False):
        name = "dynamo" if dynamo else "torchscript"
        path = export(model, image, stem.parent / f"{stem.name}_{name}.onnx", dynamo=dynamo, outputs=outputs)
        count = node_counts(path).get(node, 0)
        diffs = check_outputs(ort_outputs(path, image, ["CPUExecutionProvider"]), want, tolerances=tolerances)
        report[name] = dict(nodes=count, ort_cpu=diffs)
        if len(providers) > 1:
            report[name]["ort_cuda"] = check_outputs(ort_outputs(path, image, providers), want, scale=10.0,
                                                     tolerances=tolerances)
        print(f"{name}: {path}, {count} {node} nodes, ONNX Runtime vs eager {report[name]}")
    return report, path


def cli_checks(path: Path, image: np.ndarray, want: dict, out: Path, compare_reference: bool = True,
               tolerances=None, name: str = "ddetr") -> dict:
    """``dcnkit run``, ``dcnkit compare`` (ORT vs the NumPy reference runner, per-output tolerances) and
    ``dcnkit serve`` (one KServe v2 REST request, model ``name``) on the exported model, checked against eager
    ``want`` within ``tolerances`` (default ``TOLERANCES``)."""
    tolerances = tolerances or TOLERANCES
    report = {}
    inputs = out / "image.npz"
    np.savez(inputs, images=image)
    results = out / "outputs.npz"
    _dcnkit("run", path, "--inputs", inputs, "-o", results, in_process=True)
    with np.load(results) as d:
        report["cli_run"] = check_outputs({k: d[k] for k in tolerances}, want, tolerances=tolerances)
    if compare_reference:
        flags = [a for k, (atol, rtol) in tolerances.items() for a in ("--atol", f"{k}:{atol}", "--rtol", f"{k}:{rtol}")]
        _dcnkit("compare", path, "--inputs", inputs, "--backends", "ort-cpu,reference", *flags, in_process=True)
        report["compare"] = "PASSED"
    report["serve"] = check_outputs(serve_and_query(path, image, name=name), want, tolerances=tolerances)
    print(f"dcnkit serve vs eager: {report['serve']}")
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("deformable_detr"), help="folder for the models and arrays")
    p.add_argument("--height", type=int, default=64)
    p.add_argument("--width", type=int, default=96)
    p.add_argument("--seed", type=int, default=0, help="seed of the detector's weights")
    p.add_argument("--image-seed", type=int, default=0, help="seed of the synthetic image")
    p.add_argument("--skip-cli", action="store_true", help="skip dcnkit run / compare / serve")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    model = build((args.height, args.width), args.seed)
    image = make_image(max(args.height, args.width), args.image_seed)[:, :, :args.height, :args.width].copy()
    t0 = time.perf_counter()
    want = eager_outputs(model, image)
    print(f"eager: logits {want['logits'].shape}, boxes {want['boxes'].shape} ({time.perf_counter() - t0:.2f} s)")
    report, path = export_and_check(model, image, want, args.out / "deformable_detr",
                                    "dcnkit::MultiScaleDeformableAttention")
    if not args.skip_cli:
        report.update(cli_checks(path, image, want, args.out))
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print("PASSED: ONNX Runtime's outputs equal eager PyTorch's")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
