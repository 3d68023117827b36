"""Small sample models that use dcnkit's operators, and how to export them.

Run ``python export/samples.py OUT_DIR`` to export all three with both torch exporters, in standard
and custom mode, and check each against PyTorch in ONNX Runtime.

* ``DCNv2Block``: a DCNv2 backbone block (offset/mask conv -> modulated deformable conv -> BN -> ReLU,
  residual). Exports to the standard ONNX ``DeformConv`` (opset >= 19) or ``dcnkit::DeformConv2d``.
* ``RoIHead``: an RoI head with ``roi_align`` in max mode (-> ``dcnkit::RoIAlign``) and a modulated
  ``deform_roi_pool`` (mmdet's ModulatedDeformRoIPoolPack pattern -> ``dcnkit::DeformRoIPool``).
* ``RFCNHead``: an R-FCN head with deformable position-sensitive RoI pooling
  (``dcnkit::DeformPSRoIPool``), a ``roi_align`` avg branch (-> standard ``RoiAlign``).
* ``CombinedModel``: backbone block + both heads (every op at once).

Inputs: ``x (N, C, H, W)`` images/features and ``rois (K, 5)`` rows ``[batch_index, x1, y1, x2, y2]``.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

import dcnkit
from dcnkit import ops


class DCNv2Block(nn.Module):
    """Residual DCNv2 block: ``x + relu(bn(dcn(x)))``; the offsets and mask come from a plain conv."""

    def __init__(self, channels: int = 8, kernel_size: int = 3, deformable_groups: int = 2, groups: int = 1):
        super().__init__()
        k = kernel_size
        self.pad = k // 2
        self.offset_mask = nn.Conv2d(channels, 3 * deformable_groups * k * k, k, padding=self.pad)
        self.weight = nn.Parameter(torch.empty(channels, channels // groups, k, k))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.bn = nn.BatchNorm2d(channels)
        self.dg = deformable_groups
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        # Non-zero offsets so the export is tested with real deformation.
        nn.init.normal_(self.offset_mask.weight, std=0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        om = self.offset_mask(x)
        n_off = 2 * self.dg * self.weight.shape[2] * self.weight.shape[3]
        offset, mask = om[:, :n_off], torch.sigmoid(om[:, n_off:])
        y = ops.deform_conv2d(x, offset, self.weight, self.bias, padding=self.pad, mask=mask)
        return x + torch.relu(self.bn(y))


class RoIHead(nn.Module):
    """``roi_align`` max branch + modulated ``deform_roi_pool`` branch; returns (K, num_outputs)."""

    def __init__(self, channels: int = 8, output_size: int = 3, spatial_scale: float = 0.5,
                 hidden: int = 32, num_outputs: int = 5, gamma: float = 0.1):
        super().__init__()
        self.size = output_size
        self.scale = spatial_scale
        self.gamma = gamma
        flat = channels * output_size * output_size
        self.offset_fc = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, 2 * output_size ** 2))
        self.mask_fc = nn.Sequential(nn.Linear(flat, hidden), nn.ReLU(), nn.Linear(hidden, output_size ** 2))
        nn.init.normal_(self.offset_fc[2].weight, std=0.1)
        self.cls = nn.Linear(2 * flat, num_outputs)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        k = rois.shape[0]
        s = self.size
        peak = ops.roi_align(x, rois, s, self.scale, sampling_ratio=2, aligned=False, pool_mode="max")
        base = ops.deform_roi_pool(x, rois, None, s, self.scale, 2, self.gamma)
        offset = self.offset_fc(base.flatten(1)).view(k, 2, s, s)
        mask = torch.sigmoid(self.mask_fc(base.flatten(1))).view(k, 1, s, s)
        pooled = ops.deform_roi_pool(x, rois, offset, s, self.scale, 2, self.gamma) * mask
        return self.cls(torch.cat([peak.flatten(1), pooled.flatten(1)], 1))


class RFCNHead(nn.Module):
    """R-FCN head: position-sensitive score maps pooled with learned part offsets; returns (K, classes)."""

    def __init__(self, channels: int = 8, num_classes: int = 3, group_size: int = 3, spatial_scale: float = 0.5,
                 trans_std: float = 0.1):
        super().__init__()
        g = group_size
        self.g, self.classes, self.scale, self.trans_std = g, num_classes, spatial_scale, trans_std
        self.score = nn.Conv2d(channels, num_classes * g * g, 1)
        self.ctx = nn.Conv2d(channels, channels * 1, 1)
        self.trans_fc = nn.Linear(channels * g * g, 2 * g * g)
        nn.init.normal_(self.trans_fc.weight, std=0.5)

    def forward(self, x: torch.Tensor, rois: torch.Tensor) -> torch.Tensor:
        k, g = rois.shape[0], self.g
        # Offsets (one class-agnostic pair per part) predicted from plain RoIAlign features.
        feats = ops.roi_align(self.ctx(x), rois, g, self.scale, sampling_ratio=0, aligned=True)
        trans = self.trans_fc(feats.flatten(1)).view(k, 2, g, g)
        pooled = ops.deform_psroi_pool(self.score(x), rois, trans, self.scale, g, self.classes, g,
                                       part_size=g, sample_per_part=2, trans_std=self.trans_std)
        return pooled.mean(dim=(2, 3))


class CombinedModel(nn.Module):
    """Backbone block followed by both heads: every dcnkit operator in one graph."""

    def __init__(self, channels: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.block = DCNv2Block(channels)
        self.roi_head = RoIHead(channels)
        self.rfcn_head = RFCNHead(channels)

    def forward(self, x: torch.Tensor, rois: torch.Tensor):
        f = self.block(torch.relu(self.stem(x)))
        return self.roi_head(f, rois), self.rfcn_head(f, rois)


def random_rois(k: int, batch: int, height: int, width: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """``k`` boxes ``[batch_index, x1, y1, x2, y2]`` in image coordinates, some reaching past the border."""
    g = generator
    b = torch.randint(0, batch, (k, 1), generator=g).float()
    xy = torch.rand(k, 2, generator=g) * torch.tensor([width, height]) - 2
    wh = torch.rand(k, 2, generator=g) * torch.tensor([width, height]) * 0.6 + 0.5
    return torch.cat([b, xy, xy + wh], 1)


def sample_inputs(name: str, batch: int = 2, num_rois: int = 3, size: int = 12, channels: int = 8, seed: int = 0):
    """Example inputs for the sample ``name`` ("block", "roi_head", "rfcn_head", "combined")."""
    g = torch.Generator().manual_seed(seed)
    if name == "block":
        return (torch.randn(batch, channels, size, size, generator=g),)
    image = 2 * size  # heads run at spatial_scale 0.5: boxes are in image coordinates
    rois = random_rois(num_rois, batch, image, image, g)
    c = 3 if name == "combined" else channels
    return (torch.randn(batch, c, size, size, generator=g), rois)


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = {"block": DCNv2Block, "roi_head": RoIHead, "rfcn_head": RFCNHead, "combined": CombinedModel}[name]()
    return model.eval()


SAMPLES = ("block", "roi_head", "rfcn_head", "combined")


def main(out_dir: str) -> int:
    import numpy as np

    import dcnkit.export
    from dcnkit.runtime import ort_session

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    worst = 0.0
    for name in SAMPLES:
        model = build(name)
        for dynamo in (True, False):
            for standard in (True, False):
                path = out / f"{name}-{'dynamo' if dynamo else 'torchscript'}-{'std' if standard else 'custom'}.onnx"
                dcnkit.export.to_onnx(model, sample_inputs(name), path, dynamo=dynamo, standard_ops=standard)
                sess = ort_session(str(path))
                ins = sample_inputs(name, batch=3, num_rois=5, seed=1)  # other batch and RoI count
                with torch.no_grad():
                    ref = model(*ins)
                ref = ref if isinstance(ref, tuple) else (ref,)
                got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), ins)})
                # fp32 tolerance: |onnx - torch| <= 1e-5 * |torch| + 1e-6
                excess = max(float(np.max(np.abs(r.numpy() - o) / (1e-5 * np.abs(r.numpy()) + 1e-6)))
                             for r, o in zip(ref, got))
                worst = max(worst, excess)
                print(f"{path.name}: {'ok' if excess <= 1 else 'MISMATCH'} "
                      f"(max |diff| / (1e-5 |torch| + 1e-6) = {excess:.2f})")
    print(f"worst {worst:.2f} (<= 1 passes)")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "dcnkit-export-samples"))
