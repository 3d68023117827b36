"""Inputs for the DCNv3 / DCNv4 tests and the operators written with torch's grid_sample, the way InternImage's
pure-PyTorch core computes them (an independent formulation: pad the map, normalised reference points plus the
kernel grid plus offset * offset_scale, grid_sample(align_corners=False, zeros), weighted sum over points)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

# (kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, group_channels, offset_scale)
ATTRS = (3, 3, 1, 1, 1, 1, 1, 1, 2, 4, 1.0)


def out_size(h, w, kh, kw, sh, sw, ph, pw, dh, dw):
    return (h + 2 * ph - (dh * (kh - 1) + 1)) // sh + 1, (w + 2 * pw - (dw * (kw - 1) + 1)) // sw + 1


def make_inputs(n=2, h=7, w=6, attrs=ATTRS, remove_center=0, dtype=torch.float64, seed=0, offset_std=1.5):
    """(input, offset, mask) for DCNv3 and the attrs; the mask is softmaxed per group like InternImage's module."""
    kh, kw, sh, sw, ph, pw, dh, dw, g, gc, _ = attrs
    gen = torch.Generator().manual_seed(seed)
    k = kh * kw - remove_center
    ho, wo = out_size(h, w, kh, kw, sh, sw, ph, pw, dh, dw)
    x = torch.randn(n, h, w, g * gc, generator=gen, dtype=torch.float64)
    offset = torch.randn(n, ho, wo, g * k * 2, generator=gen, dtype=torch.float64) * offset_std
    mask = torch.randn(n, ho, wo, g, k, generator=gen, dtype=torch.float64).softmax(-1).reshape(n, ho, wo, g * k)
    return x.to(dtype), offset.to(dtype), mask.to(dtype)


def dcnv4_offset_mask(offset, mask, group, points):
    """DCNv3's offset and mask laid out as DCNv4's offset_mask: per group 2K offsets then K weights, padded to 8."""
    n, ho, wo, _ = offset.shape
    per_group = torch.cat([offset.reshape(n, ho, wo, group, 2 * points), mask.reshape(n, ho, wo, group, points)], -1)
    flat = per_group.reshape(n, ho, wo, group * 3 * points)
    cp = (group * 3 * points + 7) // 8 * 8
    pad = torch.full((n, ho, wo, cp - flat.shape[-1]), 1e30, dtype=flat.dtype)  # ignored: must not matter
    return torch.cat([flat, pad], -1)


def grid_sample_dcnv3(x, offset, mask, kh, kw, sh, sw, ph, pw, dh, dw, group, gc, offset_scale, remove_center=0):
    n, _, _, c = x.shape
    xp = F.pad(x, [0, 0, pw, pw, ph, ph])
    hp, wp = xp.shape[1:3]
    ho, wo = out_size(x.shape[1], x.shape[2], kh, kw, sh, sw, ph, pw, dh, dw)
    # Reference points: the centre of each output's receptive field in the padded map, normalised.
    cy, cx = (dh * (kh - 1)) // 2, (dw * (kw - 1)) // 2
    ref_y = (cy + 0.5 + torch.arange(ho, dtype=x.dtype) * sh) / hp
    ref_x = (cx + 0.5 + torch.arange(wo, dtype=x.dtype) * sw) / wp
    ref = torch.stack(torch.meshgrid(ref_x, ref_y, indexing="xy"), -1)  # (ho, wo, 2) as (x, y)
    # Kernel grid, w-major: point k = i_w * kh + i_h.
    gx = (torch.arange(kw, dtype=x.dtype) * dw - cx) / wp
    gy = (torch.arange(kh, dtype=x.dtype) * dh - cy) / hp
    grid = torch.stack([gx[:, None].expand(kw, kh), gy[None, :].expand(kw, kh)], -1).reshape(kw * kh, 2)
    if remove_center:
        keep = [i for i in range(kh * kw) if i != (kh * kw - 1) // 2]
        grid = grid[keep]
    k = grid.shape[0]
    norm = torch.tensor([wp, hp], dtype=x.dtype)
    loc = ref[:, :, None, None] + grid[None, None, None] * offset_scale  # (ho, wo, 1, k, 2)
    loc = loc + offset.reshape(n, ho, wo, group, k, 2) * offset_scale / norm  # (n, ho, wo, g, k, 2)
    grids = (2 * loc - 1).permute(0, 3, 1, 2, 4, 5).reshape(n * group, ho * wo, k, 2)
    img = xp.reshape(n, hp, wp, group, gc).permute(0, 3, 4, 1, 2).reshape(n * group, gc, hp, wp)
    samples = F.grid_sample(img, grids, mode="bilinear", padding_mode="zeros", align_corners=False)  # (ng, gc, hw, k)
    m = mask.reshape(n, ho * wo, group, k).permute(0, 2, 1, 3).reshape(n * group, 1, ho * wo, k)
    out = (samples * m).sum(-1)  # (n*g, gc, ho*wo)
    return out.reshape(n, group * gc, ho, wo).permute(0, 2, 3, 1).reshape(n, ho, wo, c)
