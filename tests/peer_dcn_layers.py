"""InternImage's ``DCNv3`` layer and the DCNv4 package's ``DCNv4`` layer written out as functions of a state dict
(their parameter names), over the grid_sample formulation of the op (dcnv3_cases.grid_sample_dcnv3), in eval mode.

What is theirs, read from their modules (InternImage classification/ops_dcnv3/modules/dcnv3.py, DCNv4
DCNv4_op/DCNv4/modules/dcnv4.py): build_norm_layer 'LN' is LayerNorm(eps=1e-6), 'BN' a default BatchNorm2d
(eps 1e-5); build_act_layer GELU (exact), ReLU, SiLU; DCNv3's centre-feature-scale gate is computed from the
dw_conv features, DCNv4's from the sampled output; the gate of group g covers that group's channels.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from dcnv3_cases import grid_sample_dcnv3

INTERNIMAGE_LN_EPS = 1e-6
BATCHNORM_EPS = 1e-5
ACTS = {"GELU": F.gelu, "ReLU": F.relu, "SiLU": F.silu}


def _gate(state, query, x, x_proj, group):
    s = F.linear(query, state["center_feature_scale_proj_weight"], state["center_feature_scale_proj_bias"])
    s = s.sigmoid().repeat_interleave(x.shape[-1] // group, dim=-1)
    return x * (1 - s) + x_proj * s


def internimage_dcnv3(state, x, *, group, kernel_size=3, pad=1, offset_scale=1.0, act_layer="GELU",
                      norm_layer="LN", center_feature_scale=False, remove_center=0):
    """InternImage's DCNv3.forward for input x (N, H, W, C) (stride 1, dilation 1)."""
    n, h, w, c = x.shape
    k = kernel_size
    v = F.linear(x, state["input_proj.weight"], state["input_proj.bias"])
    dw = state["dw_conv.0.weight"]
    x1 = F.conv2d(x.permute(0, 3, 1, 2), dw, state["dw_conv.0.bias"], padding=(dw.shape[-1] - 1) // 2, groups=c)
    if norm_layer == "LN":
        x1 = F.layer_norm(x1.permute(0, 2, 3, 1), (c,), state["dw_conv.1.1.weight"], state["dw_conv.1.1.bias"],
                          eps=INTERNIMAGE_LN_EPS)
    else:
        x1 = F.batch_norm(x1, state["dw_conv.1.0.running_mean"], state["dw_conv.1.0.running_var"],
                          state["dw_conv.1.0.weight"], state["dw_conv.1.0.bias"], training=False,
                          eps=BATCHNORM_EPS).permute(0, 2, 3, 1)
    x1 = ACTS[act_layer](x1)
    off = F.linear(x1, state["offset.weight"], state["offset.bias"])
    m = F.linear(x1, state["mask.weight"], state["mask.bias"]).reshape(n, h, w, group, -1).softmax(-1)
    y = grid_sample_dcnv3(v, off, m.reshape(n, h, w, -1), k, k, 1, 1, pad, pad, 1, 1, group, c // group,
                          offset_scale, remove_center)
    if center_feature_scale:
        y = _gate(state, x1, y, v, group)
    return F.linear(y, state["output_proj.weight"], state["output_proj.bias"])


def dcnv4_package(state, x, shape, *, group, kernel_size=3, pad=1, offset_scale=1.0, center_feature_scale=False,
                  remove_center=0):
    """The DCNv4 package's DCNv4.forward for input x (N, L, C), shape (H, W), without dw_kernel_size."""
    n, length, c = x.shape
    h, w = shape
    k, points = kernel_size, kernel_size * kernel_size - remove_center
    v = F.linear(x, state["value_proj.weight"], state["value_proj.bias"]).reshape(n, h, w, c)
    om = F.linear(x, state["offset_mask.weight"], state["offset_mask.bias"]).reshape(n, h, w, -1)
    per_group = om[..., :group * 3 * points].reshape(n, h, w, group, 3 * points)  # [2K offsets, K weights]
    off = per_group[..., :2 * points].reshape(n, h, w, -1)
    m = per_group[..., 2 * points:].reshape(n, h, w, -1)
    y = grid_sample_dcnv3(v, off, m, k, k, 1, 1, pad, pad, 1, 1, group, c // group, offset_scale, remove_center)
    if center_feature_scale:
        y = _gate(state, y, y, v, group)
    return F.linear(y.reshape(n, length, c), state["output_proj.weight"], state["output_proj.bias"])


def random_state(layer: torch.nn.Module, seed: int, scale: float = 0.3) -> dict:
    """A random state dict of the layer's keys and shapes (a stand-in for a published checkpoint)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for key, t in layer.state_dict().items():
        if key.endswith("num_batches_tracked"):
            out[key] = torch.tensor(3)
        elif key.endswith("running_var"):
            out[key] = torch.rand(t.shape, generator=gen, dtype=torch.float64) + 0.5
        else:
            out[key] = torch.randn(t.shape, generator=gen, dtype=torch.float64) * scale
    return out
