"""Out-of-map bilinear neighbours are never read (docs/operators.md, issue 26 item 6): with Inf and NaN in the
corners of the maps, every operator that samples bilinearly equals the library that defines it -- torchvision's
deform_conv2d and roi_align, grid_sample(zeros) for multi-scale deformable attention and DCNv3 -- forward and
backward, NaN for NaN, on the CPU fast paths, the CPU runs of the CUDA code (DCNKIT_DCN_CPU_PATH) and ONNX
Runtime's CPU EP. A neighbour inside the map is read even with weight 0, as those libraries do."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from dcnkit import reference as R
from dcnkit.ops import dcnv3, deform_conv2d, multi_scale_deformable_attn, roi_align
from dcnkit.runtime import ort_session

from dcnv3_cases import ATTRS, grid_sample_dcnv3
from dcnv3_cases import make_inputs as dcnv3_inputs
from msda_cases import grid_sample_msda
from msda_cases import make_inputs as msda_inputs

tvops = pytest.importorskip("torchvision.ops", reason="torchvision defines deform_conv2d and roi_align")

INF, NAN = float("inf"), float("nan")


def poison_corners(x, h_dim, w_dim):
    """x with +Inf, NaN, -Inf, NaN in the four corners of every map (dims h_dim, w_dim), per channel rotated so
    that each corner holds each kind somewhere."""
    x = x.clone()
    kinds = [INF, NAN, -INF, NAN]
    corners = [(0, 0), (0, -1), (-1, 0), (-1, -1)]
    for i, (cy, cx) in enumerate(corners):
        idx = [slice(None)] * x.dim()
        idx[h_dim], idx[w_dim] = cy, cx
        x[tuple(idx)] = kinds[i]
    return x


def assert_same(got, want, what, rtol=1e-10, atol=1e-10):
    torch.testing.assert_close(got, want, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def grads(fn, tensors, gy):
    leaves = [t.clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    y.backward(gy)
    return y.detach(), [t.grad for t in leaves]


# ---- DeformConv2d vs torchvision ---------------------------------------------------------------------


def test_issue_example_border_samples_are_zero():
    x = torch.zeros(1, 1, 4, 4)
    x[0, 0, 0, 0] = INF
    y = deform_conv2d(x, torch.full((1, 2, 4, 4), 0.5), torch.ones(1, 1, 1, 1))
    want = tvops.deform_conv2d(x, torch.full((1, 2, 4, 4), 0.5), torch.ones(1, 1, 1, 1))
    assert torch.isfinite(y[0, 0, 1:, :]).all() and torch.isfinite(y[0, 0, :, 1:]).all()
    assert_same(y, want, "output")


def dcn_case(dtype=torch.float64, seed=0):
    """A 3x3 modulated DCN whose samples straddle every border (fractional parts kept away from 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    n, cin, h, w, cout = 2, 4, 9, 10, 3
    x = poison_corners(torch.randn(n, cin, h, w, generator=g, dtype=torch.float64), 2, 3)
    whole = torch.randint(-1, 2, (n, 2 * 2 * 9, h, w), generator=g).double()
    offset = whole + 0.15 + 0.7 * torch.rand(n, 2 * 2 * 9, h, w, generator=g, dtype=torch.float64)
    weight = torch.randn(cout, cin, 3, 3, generator=g, dtype=torch.float64)
    bias = torch.randn(cout, generator=g, dtype=torch.float64)
    mask = torch.rand(n, 2 * 9, h, w, generator=g, dtype=torch.float64)
    gy = torch.randn(n, cout, h, w, generator=g, dtype=torch.float64)
    return [t.to(dtype) for t in (x, offset, weight, bias, mask)], gy.to(dtype)


def dcn_ours(x, offset, weight, bias, mask):
    return deform_conv2d(x, offset, weight, bias, 1, 1, 1, mask)


def dcn_theirs(x, offset, weight, bias, mask):
    return tvops.deform_conv2d(x, offset, weight, bias, padding=(1, 1), mask=mask)


def check_dcn(got, dtype):
    inputs, gy = dcn_case(dtype)
    y, g = grads(dcn_theirs, inputs, gy)
    tol = 1e-10 if dtype == torch.float64 else 1e-4
    assert torch.isfinite(y).any() and not torch.isfinite(y).all()  # the corners are read, and only there
    assert_same(got[0], y, "output", tol, tol)
    for name, a, b in zip(("input", "offset", "weight", "bias", "mask"), got[1], g):
        assert_same(a, b, f"grad {name}", tol, tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_deform_conv2d_matches_torchvision(dtype):
    inputs, gy = dcn_case(dtype)
    check_dcn(grads(dcn_ours, inputs, gy), dtype)


_DCN_CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from test_border_samples import dcn_case, dcn_ours, grads
    torch.save(grads(dcn_ours, *dcn_case()), sys.argv[1])
""")


@pytest.mark.parametrize("path", ["elementwise", "cuda-schedule"])
def test_deform_conv2d_cuda_code_on_the_cpu_matches_torchvision(tmp_path, path):
    # The CUDA kernels' per-thread functions and launch schedule, run on the CPU (read once per process).
    env = dict(os.environ, DCNKIT_DCN_CPU_PATH=path)
    out = tmp_path / "out.pt"
    subprocess.run([sys.executable, "-c", _DCN_CHILD, str(out), os.path.dirname(__file__)], env=env, check=True,
                   timeout=300)
    check_dcn(torch.load(out), torch.float64)


# ---- multi-scale deformable attention and DCNv3 vs grid_sample ---------------------------------------


def msda_case(dtype=torch.float64):
    value, shapes, starts, loc, attn = msda_inputs(sizes=((4, 5), (3, 3), (1, 2)), queries=9, seed=7, spread=0.3)
    # Corners of every level: rows start, start + W - 1, start + (H - 1) * W, start + H * W - 1.
    value = value.clone()
    kinds = [INF, NAN, -INF, NAN]
    for (h, w), s in zip(shapes.tolist(), starts.tolist()):
        for i, r in enumerate(sorted({s, s + w - 1, s + (h - 1) * w, s + h * w - 1})):
            value[:, r, :, i % value.shape[-1]] = kinds[i]
    gy = torch.randn(value.shape[0], loc.shape[1], value.shape[2] * value.shape[3], dtype=torch.float64)
    return [t.to(dtype) for t in (value, loc, attn)], shapes, starts, gy.to(dtype)


def test_msda_matches_grid_sample():
    (value, loc, attn), shapes, starts, gy = msda_case()
    y, g = grads(lambda v, lo, a: multi_scale_deformable_attn(v, shapes, starts, lo, a), (value, loc, attn), gy)
    y_ref, g_ref = grads(lambda v, lo, a: grid_sample_msda(v, shapes, lo, a), (value, loc, attn), gy)
    assert torch.isfinite(y).any() and not torch.isfinite(y).all()
    assert_same(y, y_ref, "output")
    for name, a, b in zip(("value", "sampling_locations", "attention_weights"), g, g_ref):
        assert_same(a, b, f"grad {name}")


def dcnv3_case(dtype=torch.float64):
    x, offset, mask = dcnv3_inputs(h=6, w=7, seed=3, offset_std=2.0)
    x = poison_corners(x, 1, 2)
    gy = torch.randn(x.shape, dtype=torch.float64)
    return [t.to(dtype) for t in (x, offset, mask)], gy.to(dtype)


def test_dcnv3_matches_grid_sample():
    inputs, gy = dcnv3_case()
    y, g = grads(lambda x, o, m: dcnv3(x, o, m, *ATTRS), inputs, gy)
    y_ref, g_ref = grads(lambda x, o, m: grid_sample_dcnv3(x, o, m, *ATTRS), inputs, gy)
    assert torch.isfinite(y).any() and not torch.isfinite(y).all()
    assert_same(y, y_ref, "output")
    for name, a, b in zip(("input", "offset", "mask"), g, g_ref):
        assert_same(a, b, f"grad {name}")


def test_dcnv3_reads_a_neighbour_inside_the_map_even_with_weight_zero():
    """A location on row 1 exactly: row 2 (weight 0) is read, as InternImage's kernel and grid_sample do; a location
    on the last row: the row below (outside) is not."""
    x = torch.zeros(1, 3, 3, 1, dtype=torch.float64)
    x[0, 2, 0, 0] = INF
    attrs = (1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1.0)
    mask = torch.ones(1, 3, 3, 1, dtype=torch.float64)
    offset = torch.zeros(1, 3, 3, 2, dtype=torch.float64)
    y = dcnv3(x, offset, mask, *attrs)
    assert_same(y, grid_sample_dcnv3(x, offset, mask, *attrs), "output")
    assert torch.isnan(y[0, 1, 0, 0]) and y[0, 2, 0, 0] == INF and torch.isfinite(y[0, :, 1:]).all()


# ---- RoIAlign vs torchvision -----------------------------------------------------------------------


def test_roi_align_matches_reference_and_torchvision():
    g = torch.Generator().manual_seed(5)
    x = poison_corners(torch.randn(2, 3, 6, 7, generator=g, dtype=torch.float64), 2, 3)
    # Boxes on each border and past it (clamped sampling reads the border rows and columns, corners included; samples
    # past -1 or H, W are empty).
    rois = torch.tensor([[0, -2.5, -2.5, 2.0, 2.0], [1, 4.2, 3.1, 8.9, 7.6], [0, 1.0, 2.0, 5.0, 4.0],
                         [1, -0.7, 3.3, 3.1, 6.4], [0, 5.1, -2.0, 7.6, 1.8]], dtype=torch.float64)
    gy = torch.randn(5, 3, 2, 3, generator=g, dtype=torch.float64)
    # torchvision's CPU kernel reads pixel (0, 0) with weight 0 for an empty sample (its CUDA kernel does not, nor does
    # dcnkit): against it, that corner is finite; against the NumPy reference, it is poisoned too.
    x_tv = x.clone()
    x_tv[:, :, 0, 0] = 1.0
    for aligned in (False, True):
        y = roi_align(x, rois, (2, 3), 1.0, 2, aligned)
        assert torch.isfinite(y).any() and not torch.isfinite(y).all()
        want = torch.from_numpy(R.roi_align(x.numpy(), rois.numpy(), (2, 3), 1.0, 2, aligned))
        assert_same(y, want, f"output aligned={aligned}")
        y, (gx,) = grads(lambda t: roi_align(t, rois, (2, 3), 1.0, 2, aligned), (x_tv,), gy)
        y_ref, (gx_ref,) = grads(lambda t: tvops.roi_align(t, rois, (2, 3), 1.0, 2, aligned), (x_tv,), gy)
        assert_same(y, y_ref, f"output aligned={aligned} vs torchvision")
        assert_same(gx, gx_ref, f"grad input aligned={aligned} vs torchvision")


# ---- ONNX Runtime CPU EP ---------------------------------------------------------------------------


def _session(op_type, names, **attrs):
    vi = helper.make_tensor_value_info
    types = {"spatial_shapes": TensorProto.INT64, "level_start_index": TensorProto.INT64}
    node = helper.make_node(op_type, names, ["y"], domain="dcnkit", **attrs)
    graph = helper.make_graph([node], "g", [vi(n, types.get(n, TensorProto.FLOAT), None) for n in names],
                              [vi("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                              ir_version=10)
    return ort_session(model.SerializeToString(), providers=["CPUExecutionProvider"], intra_op_num_threads=2)


def test_ort_cpu_matches_torchvision_and_grid_sample():
    (x, offset, weight, bias, mask), _ = dcn_case(torch.float32)
    sess = _session("DeformConv2d", ["x", "offset", "weight", "bias", "mask"], stride=[1, 1], padding=[1, 1],
                    dilation=[1, 1], groups=1, deformable_groups=2)
    feeds = dict(zip(["x", "offset", "weight", "bias", "mask"], (t.numpy() for t in (x, offset, weight, bias, mask))))
    got = torch.from_numpy(sess.run(None, feeds)[0])
    assert_same(got, dcn_theirs(x, offset, weight, bias, mask), "DeformConv2d", 1e-4, 1e-4)

    (value, loc, attn), shapes, starts, _ = msda_case(torch.float32)
    names = ["value", "spatial_shapes", "level_start_index", "sampling_locations", "attention_weights"]
    sess = _session("MultiScaleDeformableAttention", names)
    got = torch.from_numpy(sess.run(None, dict(zip(names, (t.numpy() for t in (value, shapes, starts, loc, attn)))))[0])
    assert_same(got, grid_sample_msda(value, shapes, loc, attn), "MultiScaleDeformableAttention", 1e-5, 1e-5)

    (x, offset, mask), _ = dcnv3_case(torch.float32)
    keys = ("kernel_h", "kernel_w", "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "group",
            "group_channels")
    sess = _session("DCNv3", ["input", "offset", "mask"], **dict(zip(keys, ATTRS[:-1])), offset_scale=ATTRS[-1])
    got = torch.from_numpy(sess.run(None, {"input": x.numpy(), "offset": offset.numpy(), "mask": mask.numpy()})[0])
    assert_same(got, grid_sample_dcnv3(x, offset, mask, *ATTRS), "DCNv3", 1e-5, 1e-5)
    assert np.isfinite(got.numpy()).any()
