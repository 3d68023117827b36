"""Every torch op of the kit as a small differentiable case, shared by the CUDA tests (graphs, 16-bit backward).

A case is (name, fn, tensors, differentiable): fn(*tensors) -> one output tensor; tensors are float64 CPU
values (the test converts them); differentiable[i] says whether tensors[i] gets a gradient.
"""
from __future__ import annotations

import torch

from dcnkit.ops import deform_conv2d, deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align
from dcnkit.ops import dcnv3, dcnv4, multi_scale_deformable_attn


def _rois(g, k, n, h, w):
    bi = torch.randint(0, n, (k, 1), generator=g).double()
    a = torch.rand(k, 2, generator=g, dtype=torch.float64) * torch.tensor([w * 0.6, h * 0.6], dtype=torch.float64)
    b = a + 1.0 + torch.rand(k, 2, generator=g, dtype=torch.float64) * torch.tensor([w * 0.4, h * 0.4],
                                                                                    dtype=torch.float64)
    return torch.cat([bi, a, b], 1)


def _off_lattice(t):
    """DCNv3/DCNv4 offsets as odd multiples of 1/64 in (-4, 4): exact in float16 and bfloat16, and with
    offset_scale 0.8 a sampling coordinate (j + dx) * 0.8 is (odd) / 80, never within 1/80 of an integer. A point on
    a cell edge has two one-sided offset derivatives, and whether the device's fused multiply-add lands it on one
    side or the other is rounding, not a bug: the 16-bit cases (rounded inputs) hit such edges with random offsets."""
    return ((t.clamp(-3.9, 3.9) * 32).floor() * 2 + 1) / 64


def op_cases(seed=0, n=3):
    """The cases; `n` images (the DCN grad_weight sums over them)."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, scale=1.0: torch.randn(*s, generator=g, dtype=torch.float64) * scale  # noqa: E731
    cases = []

    # DCNv2: groups, deformable groups, bias, mask, stride/dilation.
    x, w = r(n, 4, 9, 8), r(6, 2, 3, 3, scale=0.5)
    off, m, b = r(n, 2 * 2 * 9, 9, 8, scale=1.5), torch.rand(n, 2 * 9, 9, 8, generator=g, dtype=torch.float64), r(6)
    cases.append(("deform_conv2d_v2", lambda x, o, w, b, m: deform_conv2d(x, o, w, b, 1, 1, 1, m),
                  [x, off, w, b, m], [True] * 5))
    # DCNv1 without bias, strided.
    x, w = r(n, 3, 10, 9), r(4, 3, 3, 3, scale=0.5)
    ho, wo = (10 + 2 - 3) // 2 + 1, (9 + 2 - 3) // 2 + 1
    off = r(n, 18, ho, wo, scale=1.5)
    cases.append(("deform_conv2d_v1", lambda x, o, w: deform_conv2d(x, o, w, None, 2, 1, 1, None),
                  [x, off, w], [True] * 3))

    x = r(n, 4, 12, 11)
    rois = _rois(g, 7, n, 12, 11)
    cases.append(("roi_align_avg", lambda x, rois: roi_align(x, rois, 3, 1.0, 2, True, "avg"),
                  [x, rois], [True, False]))
    cases.append(("roi_align_max_adaptive", lambda x, rois: roi_align(x, rois, (3, 2), 0.8, -1, False, "max"),
                  [x, rois], [True, False]))
    off = r(7, 2, 3, 3, scale=0.3)
    cases.append(("deform_roi_pool", lambda x, rois, o: deform_roi_pool(x, rois, o, 3, 1.0, 2, 0.1),
                  [x, rois, off], [True, False, True]))
    xp = r(n, 2 * 4, 12, 11)
    trans = r(7, 2, 3, 3, scale=0.3)
    cases.append(("deform_psroi_pool",
                  lambda x, rois, t: deform_psroi_pool(x, rois, t, 1.0, 3, 2, 2, None, 3, 0.1),
                  [xp, rois, trans], [True, False, True]))
    # Multi-level RoIAlign: three maps (strides 2, 4, 8 of a 24 x 22 image), RoIs on every level
    # (finest_scale 4: sides below 8 on level 0, 8-16 on level 1, above 16 on level 2), rescaled by 1.2.
    maps = [r(n, 3, 12, 11), r(n, 3, 6, 6), r(n, 3, 3, 3)]
    sides = torch.tensor([3.0, 6.5, 10.0, 13.0, 18.0, 21.0], dtype=torch.float64)
    xy = torch.rand(6, 2, generator=g, dtype=torch.float64) * 4
    bi = torch.randint(0, n, (6, 1), generator=g).double()
    ml_rois = torch.cat([bi, xy, xy + sides[:, None]], 1)
    cases.append(("multi_level_roi_align",
                  lambda f0, f1, f2, rois: multi_level_roi_align([f0, f1, f2], rois, 2, [2.0, 4.0, 8.0], 2, 4, 1.2),
                  [*maps, ml_rois], [True, True, True, False]))
    # Multi-scale deformable attention: levels 6x5, 3x4, 2x2 (S = 46), 2 heads of 5 channels, 7 queries, 3
    # points, some locations outside [0, 1]. The level tables travel as one float tensor of exact small integers
    # (rows H, W, start), made int64 on the device inside fn (a device cast: capturable, no host copy).
    tables = torch.tensor([[6, 5, 0], [3, 4, 30], [2, 2, 42]], dtype=torch.float64)
    value, loc = r(n, 46, 2, 5), torch.rand(n, 7, 2, 3, 3, 2, generator=g, dtype=torch.float64) * 1.4 - 0.2
    attn = torch.rand(n, 7, 2, 3, 3, generator=g, dtype=torch.float64)
    cases.append(("multi_scale_deformable_attn",
                  lambda v, t, l, a: multi_scale_deformable_attn(v, t[:, :2].long(), t[:, 2].long(), l, a),
                  [value, tables, loc, attn], [True, False, True, True]))
    # DCNv3: 3x3, stride (2, 1), dilation (1, 2), 2 groups of 3 channels, offset_scale 0.8 (channels-last).
    v3 = (3, 3, 2, 1, 1, 1, 1, 2, 2, 3, 0.8)
    x, off = r(n, 8, 7, 6), _off_lattice(r(n, 4, 5, 2 * 9 * 2, scale=1.5))
    mask = torch.rand(n, 4, 5, 2 * 9, generator=g, dtype=torch.float64)
    cases.append(("dcnv3", lambda x, o, m: dcnv3(x, o, m, *v3), [x, off, mask], [True] * 3))
    # DCNv4 with softmax and remove_center: K = 8, offset_mask 2 * 3 * 8 = 48 channels.
    om = _off_lattice(r(n, 4, 5, 48, scale=1.5))
    cases.append(("dcnv4", lambda x, om: dcnv4(x, om, *v3, remove_center=1, softmax=True), [x, om], [True] * 2))
    return cases


CASE_NAMES = [c[0] for c in op_cases()]


def case(name, **kw):
    return next(c for c in op_cases(**kw) if c[0] == name)


def forward_backward(fn, tensors, differentiable, grad_output=None, seed=1):
    """Output and input gradients (None for non-differentiable inputs) of fn at `tensors`.

    `tensors` are used as given (their device and dtype); leaves are made from them. grad_output defaults to
    a fixed random tensor shaped like the output."""
    leaves = [t.detach().clone().requires_grad_(d) for t, d in zip(tensors, differentiable)]
    y = fn(*leaves)
    if grad_output is None:
        gen = torch.Generator().manual_seed(seed)
        grad_output = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(y.device, y.dtype)
    y.backward(grad_output)
    return y.detach(), [t.grad if d else None for t, d in zip(leaves, differentiable)], grad_output
