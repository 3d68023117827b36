"""An InternImage-style classifier from PyTorch to ONNX Runtime, end to end.

The published InternImage layout (Wang et al., "InternImage", ``classification/models/intern_image.py``), made
small: the stem (``patch_embed``: two 3x3 stride-2 convolutions with norms, channels-last out), ``levels`` of
``InternImageLayer`` blocks (``norm1``, ``dcn`` = ``dcnkit.nn.DCNv3``, ``norm2``, ``mlp.fc1`` / ``mlp.fc2``, residual
adds), each level closed by a LayerNorm and, but for the last, a ``DownsampleLayer`` (3x3 stride-2 convolution +
norm); ``conv_head`` (1x1 convolution, BatchNorm, GELU), global average pooling and a linear ``head``. The module
and parameter names are InternImage's, so the state-dict keys have its shape. Outputs ``features`` (the last
level's map, (N, H/8, W/8, C) channels-last) and ``logits`` (N, classes). Every DCNv3 layer exports as one
``dcnkit::DCNv3`` node; the batch is dynamic and the image size fixed at build time:

    python examples/internimage.py --out /tmp/internimage    # build, export x2, check, run, compare, serve

which does what these commands do (the factory ``build`` below works with ``dcnkit export`` too):

    dcnkit export examples/internimage.py:build -o internimage.onnx --input images:1x3x64x64
    dcnkit run internimage.onnx --inputs image.npz -o out.npz
    dcnkit compare internimage.onnx --inputs image.npz --backends ort-cpu,reference \\
        --atol features:1e-4 --rtol features:1e-3 --atol logits:1e-4 --rtol logits:1e-3
    dcnkit serve internimage.onnx --port 8000

The model is untrained (random weights from a fixed seed). InternImage initialises the offset and weight
projections of DCNv3 to zero (every kernel point at its grid position, equal weights); small random weights are
added to them so that the sampling differs per position.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deformable_detr as ddetr  # noqa: E402
# The Deformable DETR example's export / check / CLI steps, shared (and used as ex.<name> by the tests).
from deformable_detr import (check_outputs, cli_checks, export, export_and_check, node_counts,  # noqa: E402,F401
                             ort_outputs, perturb)
from faster_rcnn_dcn import make_image  # noqa: E402

OUTPUTS = ("features", "logits")
TOLERANCES = dict(features=(1e-4, 1e-3), logits=(1e-4, 1e-3))  # (atol, rtol) of ORT / the reference vs eager


def _norm(channels: int, kind: str, channels_last_in: bool, channels_last_out: bool) -> nn.Sequential:
    """InternImage's ``build_norm_layer``: LN runs channels-last, BN channels-first, with permutes around them
    as the layouts ask (a Sequential, so the keys are ``<name>.<i>.weight`` as in its checkpoints)."""
    to_last, to_first = _Permute(0, 2, 3, 1), _Permute(0, 3, 1, 2)
    layers: list = []
    if kind == "LN":
        layers += [] if channels_last_in else [to_last]
        layers.append(nn.LayerNorm(channels, eps=1e-6))
        layers += [] if channels_last_out else [to_first]
    else:
        layers += [to_first] if channels_last_in else []
        layers.append(nn.BatchNorm2d(channels))
        layers += [to_last] if channels_last_out else []
    return nn.Sequential(*layers)


class _Permute(nn.Module):
    def __init__(self, *dims: int):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.permute(*self.dims)


class StemLayer(nn.Module):
    """(N, 3, H, W) -> (N, H/4, W/4, C): conv1, norm1, act, conv2, norm2 (channels-last out)."""

    def __init__(self, out_chans: int):
        super().__init__()
        self.conv1 = nn.Conv2d(3, out_chans // 2, 3, 2, 1)
        self.norm1 = _norm(out_chans // 2, "BN", False, False)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(out_chans // 2, out_chans, 3, 2, 1)
        self.norm2 = _norm(out_chans, "BN", False, True)

    def forward(self, x):
        return self.norm2(self.conv2(self.act(self.norm1(self.conv1(x)))))


class DownsampleLayer(nn.Module):
    """(N, H, W, C) -> (N, H/2, W/2, 2C)."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, 2 * channels, 3, 2, 1, bias=False)
        self.norm = _norm(2 * channels, "LN", False, True)

    def forward(self, x):
        return self.norm(self.conv(x.permute(0, 3, 1, 2)))


class MLPLayer(nn.Module):
    def __init__(self, channels: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(channels, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, channels)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class InternImageLayer(nn.Module):
    """x + dcn(norm1(x)), then x + mlp(norm2(x)), channels-last."""

    def __init__(self, channels: int, groups: int, mlp_ratio: float = 4.0, offset_scale: float = 1.0):
        super().__init__()
        import dcnkit.nn

        self.norm1 = _norm(channels, "LN", True, True)
        self.dcn = dcnkit.nn.DCNv3(channels=channels, kernel_size=3, stride=1, pad=1, dilation=1, group=groups,
                                   offset_scale=offset_scale, act_layer="GELU", norm_layer="LN")
        self.drop_path = nn.Identity()
        self.norm2 = _norm(channels, "LN", True, True)
        self.mlp = MLPLayer(channels, int(channels * mlp_ratio))

    def forward(self, x):
        x = x + self.drop_path(self.dcn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class InternImageBlock(nn.Module):
    def __init__(self, channels: int, depth: int, groups: int, downsample: bool, **kw):
        super().__init__()
        self.blocks = nn.ModuleList(InternImageLayer(channels, groups, **kw) for _ in range(depth))
        self.norm = _norm(channels, "LN", True, True)
        self.downsample = DownsampleLayer(channels) if downsample else None

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        return self.downsample(x) if self.downsample is not None else x


class InternImage(nn.Module):
    def __init__(self, image_size=(64, 64), channels: int = 64, depths=(2, 2), groups=(4, 8), num_classes: int = 10,
                 mlp_ratio: float = 4.0, offset_scale: float = 1.0):
        super().__init__()
        self.image_size = tuple(image_size)
        self.patch_embed = StemLayer(channels)
        self.pos_drop = nn.Dropout(0.0)
        self.levels = nn.ModuleList(
            InternImageBlock(channels * 2 ** i, depth, g, downsample=i < len(depths) - 1, mlp_ratio=mlp_ratio,
                             offset_scale=offset_scale)
            for i, (depth, g) in enumerate(zip(depths, groups)))
        features = channels * 2 ** (len(depths) - 1)
        self.num_features = features
        self.conv_head = nn.Sequential(nn.Conv2d(features, features, 1, bias=False),
                                       _norm(features, "BN", False, False), nn.GELU())
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(features, num_classes)

    def forward(self, images):
        if images.dim() != 4 or images.shape[1] != 3 or tuple(images.shape[2:]) != self.image_size:
            raise ValueError(f"images: expected shape (N, 3, {self.image_size[0]}, {self.image_size[1]}) (the size "
                             f"the model was built for), got {tuple(images.shape)}")
        x = self.pos_drop(self.patch_embed(images))
        for level in self.levels:
            x = level(x)
        pooled = self.avgpool(self.conv_head(x.permute(0, 3, 1, 2))).flatten(1)
        return x, self.head(pooled)


def build(image_size=(64, 64), seed: int = 0, channels: int = 64, depths=(2, 2), groups=(4, 8),
          num_classes: int = 10, sampling_scale: float = 0.2) -> InternImage:
    """The classifier in eval mode, deterministic for a ``seed``, for images of ``image_size`` (an int: square).
    ``sampling_scale``: the standard deviation of the random weights added to every DCNv3's ``offset`` and
    ``mask`` projections (0: InternImage's zero initialisation, the plain kernel grid with equal weights)."""
    if isinstance(image_size, int):
        image_size = (image_size, image_size)
    torch.manual_seed(seed)
    model = InternImage(tuple(image_size), channels, tuple(depths), tuple(groups), num_classes)
    import dcnkit.nn

    perturb(model, dcnkit.nn.DCNv3, ("offset", "mask"), sampling_scale, seed + 1)
    return model.eval()


def eager_outputs(model, image: np.ndarray) -> dict:
    return ddetr.eager_outputs(model, image, OUTPUTS)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("internimage"), help="folder for the models and arrays")
    p.add_argument("--size", type=int, default=64, help="image height and width")
    p.add_argument("--seed", type=int, default=0, help="seed of the model's weights")
    p.add_argument("--image-seed", type=int, default=0, help="seed of the synthetic image")
    p.add_argument("--skip-cli", action="store_true", help="skip dcnkit run / compare / serve")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)

    model = build(args.size, args.seed)
    image = make_image(args.size, args.image_seed)
    t0 = time.perf_counter()
    want = eager_outputs(model, image)
    print(f"eager: features {want['features'].shape}, logits {want['logits'].shape} "
          f"({time.perf_counter() - t0:.2f} s)")
    report, path = export_and_check(model, image, want, args.out / "internimage", "dcnkit::DCNv3", OUTPUTS,
                                    TOLERANCES)
    if not args.skip_cli:
        report.update(cli_checks(path, image, want, args.out, tolerances=TOLERANCES, name="internimage"))
    (args.out / "report.json").write_text(json.dumps(report, indent=2))
    print("PASSED: ONNX Runtime's outputs equal eager PyTorch's")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
