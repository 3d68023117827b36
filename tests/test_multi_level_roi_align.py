"""multi_level_roi_align against a per-level reference built from dcnkit.ops.roi_align (pick the level of every
RoI, rescale it, RoIAlign on that level with spatial_scale = 1 / stride); gradients, opcheck, torch.compile /
torch.export, TorchScript / fx, dtypes, edge cases and bad input."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import dcnkit  # noqa: F401
from dcnkit.ops import multi_level_roi_align, roi_align

STRIDES = [4.0, 8.0, 16.0, 32.0]
IMAGE = 160  # image size; maps are IMAGE / stride


def reference_levels(rois, finest_scale, num_levels):
    """docs/operators.md's level rule, in float64."""
    r = rois.double()
    scale = torch.sqrt((r[:, 3] - r[:, 1]) * (r[:, 4] - r[:, 2]))
    lvl = torch.floor(torch.log2(scale / finest_scale + 1e-6))
    lvl = torch.nan_to_num(lvl, nan=0.0, posinf=num_levels - 1.0, neginf=0.0)
    return lvl.clamp(0, num_levels - 1).long()


def reference_rescale(rois, factor):
    """docs/operators.md's rescaling about the centre to half sizes (w + 1) * f / 2 - 0.5, in the RoIs' dtype (f = 1 is the
    identity)."""
    r = rois.clone()
    if factor > 0 and factor != 1:
        cx, cy = (r[:, 1] + r[:, 3]) * 0.5, (r[:, 2] + r[:, 4]) * 0.5
        hw = (r[:, 3] - r[:, 1] + 1) * factor * 0.5 - 0.5
        hh = (r[:, 4] - r[:, 2] + 1) * factor * 0.5 - 0.5
        r[:, 1], r[:, 3], r[:, 2], r[:, 4] = cx - hw, cx + hw, cy - hh, cy + hh
    return r


def reference(features, rois, output_size, strides, sampling_ratio=0, finest_scale=56, roi_scale_factor=1.0,
              aligned=True, pool_mode="avg"):
    """Per level: the RoIs of that level through dcnkit.ops.roi_align on its map (differentiable)."""
    oh, ow = (output_size, output_size) if isinstance(output_size, int) else output_size
    levels = reference_levels(rois, finest_scale, len(features))
    boxes = reference_rescale(rois, roi_scale_factor)
    out = features[0].new_zeros((rois.shape[0], features[0].shape[1], oh, ow))
    for lvl, (f, s) in enumerate(zip(features, strides)):
        idx = torch.nonzero(levels == lvl).flatten()
        if idx.numel() == 0:
            continue
        pooled = roi_align(f, boxes[idx], (oh, ow), 1.0 / s, sampling_ratio, aligned, pool_mode)
        out = out.index_put((idx,), pooled)
    return out


def make_features(n=2, c=3, dtype=torch.float64, strides=STRIDES, gen=None):
    g = gen or torch.Generator().manual_seed(0)
    return [torch.randn(n, c, int(IMAGE // s), int(IMAGE // s) + 1, generator=g, dtype=dtype) for s in strides]


def make_rois(k, n=2, finest_scale=56, num_levels=4, dtype=torch.float64, seed=1):
    """K RoIs of sizes from ~6 to ~700 px (every level), none within 1e-3 of a level boundary."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    while len(rows) < k:
        side = float(torch.exp(torch.empty(1).uniform_(math.log(6), math.log(700), generator=g)))
        aspect = float(torch.empty(1).uniform_(0.5, 2.0, generator=g))
        w, h = side * math.sqrt(aspect), side / math.sqrt(aspect)
        x1 = float(torch.empty(1).uniform_(-0.5 * w - 5, IMAGE - 0.3 * w, generator=g))
        y1 = float(torch.empty(1).uniform_(-0.5 * h - 5, IMAGE - 0.3 * h, generator=g))
        v = math.log2(math.sqrt(w * h) / finest_scale + 1e-6)
        if abs(v - round(v)) < 1e-3:
            continue
        b = float(torch.randint(0, n, (1,), generator=g))
        rows.append([b, x1, y1, x1 + w, y1 + h])
    return torch.tensor(rows, dtype=dtype)


# ------------------------------------------------------------------------------------------------
# Values


def test_test_rois_cover_every_level():
    levels = reference_levels(make_rois(40), 56, 4)
    assert set(levels.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("roi_scale_factor", [1.0, 1.5, 0.7, -1.0])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_matches_per_level_reference_float64(pool_mode, aligned, roi_scale_factor, sampling_ratio):
    features = make_features()
    rois = make_rois(40)
    y = multi_level_roi_align(features, rois, (3, 4), STRIDES, sampling_ratio, 56, roi_scale_factor, aligned,
                              pool_mode)
    expected = reference(features, rois, (3, 4), STRIDES, sampling_ratio, 56, roi_scale_factor, aligned, pool_mode)
    assert y.shape == (40, 3, 3, 4) and y.dtype == torch.float64
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_matches_per_level_reference_float32(pool_mode):
    features = make_features(dtype=torch.float32)
    rois = make_rois(30, dtype=torch.float32)
    y = multi_level_roi_align(features, rois, 7, STRIDES, 2, 56, 1.2, True, pool_mode)
    expected = reference(features, rois, 7, STRIDES, 2, 56, 1.2, True, pool_mode)
    torch.testing.assert_close(y, expected, rtol=1e-5, atol=1e-5)
    # roi_scale_factor 1 leaves the box bit-exact: the same values as roi_align on the level.
    y1 = multi_level_roi_align(features, rois, 7, STRIDES, 2, 56, 1.0, True, pool_mode)
    torch.testing.assert_close(y1, reference(features, rois, 7, STRIDES, 2, 56, 1.0, True, pool_mode), rtol=0, atol=0)


@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_matches_numpy_reference(pool_mode):
    """The NumPy reference of dcnkit.reference (no dcnkit kernel involved) agrees too."""
    from dcnkit import reference as R

    features = make_features(c=2)
    rois = make_rois(12)
    y = multi_level_roi_align(features, rois, (2, 3), STRIDES, 0, 56, 1.3, False, pool_mode)
    expected = R.multi_level_roi_align([f.numpy() for f in features], rois.numpy(), (2, 3), STRIDES, 0, 56, 1.3,
                                       False, pool_mode)
    torch.testing.assert_close(y, torch.from_numpy(expected), rtol=1e-10, atol=1e-10)


def test_level_rule_and_clamping():
    """A RoI of side 56 * 2^l pools on level l (clamped to [0, L-1]); finest_scale moves the boundaries."""
    features = make_features(n=1, c=2)
    x = torch.tensor
    sides = [3.0, 30.0, 55.0, 56.0, 111.0, 112.0, 224.0, 448.0, 2000.0]
    expected_levels = [0, 0, 0, 0, 0, 1, 2, 3, 3]
    for side, lvl in zip(sides, expected_levels):
        rois = x([[0.0, 5.0, 7.0, 5.0 + side, 7.0 + side]], dtype=torch.float64)
        y = multi_level_roi_align(features, rois, 2, STRIDES)
        on_level = roi_align(features[lvl], rois, 2, 1.0 / STRIDES[lvl], 0, True)
        torch.testing.assert_close(y, on_level, rtol=0, atol=0, msg=f"side {side}")
        for other in set(range(4)) - {lvl}:
            assert not torch.equal(y, roi_align(features[other], rois, 2, 1.0 / STRIDES[other], 0, True))
    # finest_scale 28: side 56 is level 1.
    rois = x([[0.0, 5.0, 7.0, 61.0, 63.0]], dtype=torch.float64)
    torch.testing.assert_close(multi_level_roi_align(features, rois, 2, STRIDES, finest_scale=28),
                               roi_align(features[1], rois, 2, 1.0 / 8, 0, True), rtol=0, atol=0)


def test_degenerate_boxes_pool_on_level_0():
    """A box of negative area (NaN level) pools on level 0, as the kernel documents."""
    features = make_features(n=1, c=2)
    rois = torch.tensor([[0.0, 50.0, 50.0, 10.0, 90.0], [0.0, 20.0, 20.0, 20.0, 20.0]], dtype=torch.float64)
    y = multi_level_roi_align(features, rois, 2, STRIDES, aligned=False)
    torch.testing.assert_close(y, roi_align(features[0], rois, 2, 0.25, 0, False), rtol=0, atol=0)


def test_one_level_is_roi_align():
    x = torch.randn(2, 3, 20, 17, dtype=torch.float64)
    rois = make_rois(12)
    for mode in ("avg", "max"):
        y = multi_level_roi_align([x], rois, (2, 3), [8.0], 2, 56, 1.0, False, mode)
        torch.testing.assert_close(y, roi_align(x, rois, (2, 3), 1 / 8.0, 2, False, mode), rtol=0, atol=0)


def test_empty_rois_forward_and_backward():
    features = [f.requires_grad_() for f in make_features()]
    rois = torch.zeros(0, 5, dtype=torch.float64)
    y = multi_level_roi_align(features, rois, (3, 2), STRIDES)
    assert y.shape == (0, 3, 3, 2)
    y.sum().backward()
    for f in features:
        assert f.grad is not None and f.grad.shape == f.shape and not f.grad.any()


def test_empty_batch_and_zero_channels():
    maps = [torch.randn(0, 3, 8, 8), torch.randn(0, 3, 4, 4)]
    y = multi_level_roi_align(maps, torch.zeros(0, 5), 2, [4.0, 8.0])
    assert y.shape == (0, 3, 2, 2)
    with pytest.raises(ValueError, match=r"rois\[0, 0\] \(batch index\): expected a value in \[0, 0\)"):
        multi_level_roi_align(maps, torch.tensor([[0.0, 1, 1, 5, 5]]), 2, [4.0, 8.0])
    maps = [torch.randn(2, 0, 8, 8, requires_grad=True), torch.randn(2, 0, 4, 4, requires_grad=True)]
    y = multi_level_roi_align(maps, torch.tensor([[1.0, 1, 1, 5, 5]]), 2, [4.0, 8.0])
    assert y.shape == (1, 0, 2, 2)
    y.sum().backward()
    assert maps[0].grad.shape == maps[0].shape


@settings(max_examples=25, deadline=None)
@given(levels=st.integers(1, 5), n=st.integers(1, 2), c=st.integers(1, 3), k=st.integers(0, 12),
       oh=st.integers(1, 3), ow=st.integers(1, 3), sr=st.integers(-1, 3), finest=st.sampled_from([8, 16, 56]),
       factor=st.sampled_from([-1.0, 0.5, 1.0, 1.7]), aligned=st.booleans(), mode=st.sampled_from(["avg", "max"]),
       seed=st.integers(0, 1000))
def test_property_matches_per_level_reference(levels, n, c, k, oh, ow, sr, finest, factor, aligned, mode, seed):
    g = torch.Generator().manual_seed(seed)
    strides = [2.0 ** (i + 1) for i in range(levels)]
    maps = [torch.randn(n, c, max(1, 64 // int(s)), max(1, 48 // int(s)), generator=g, dtype=torch.float64)
            for s in strides]
    xy = torch.rand(k, 2, generator=g, dtype=torch.float64) * 70 - 10
    wh = torch.exp(torch.rand(k, 2, generator=g, dtype=torch.float64) * 5)
    rois = torch.cat([torch.randint(0, n, (k, 1), generator=g).double(), xy, xy + wh], 1)
    y = multi_level_roi_align(maps, rois, (oh, ow), strides, sr, finest, factor, aligned, mode)
    torch.testing.assert_close(y, reference(maps, rois, (oh, ow), strides, sr, finest, factor, aligned, mode),
                               rtol=1e-12, atol=1e-12)


def test_non_contiguous_inputs():
    features = [f.transpose(2, 3).contiguous().transpose(2, 3) for f in make_features()]
    features[1] = features[1][:, :, ::1, :]
    rois = make_rois(10)
    rois_nc = torch.cat([rois, rois], 1)[:, :5]
    assert not features[0].is_contiguous() and not rois_nc.is_contiguous()
    torch.testing.assert_close(multi_level_roi_align(features, rois_nc, 3, STRIDES),
                               reference([f.contiguous() for f in features], rois, 3, STRIDES), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_computes_in_float32(dtype):
    features = [f.to(dtype) for f in make_features(dtype=torch.float32)]
    rois = make_rois(10, dtype=torch.float32).to(dtype)
    y = multi_level_roi_align(features, rois, 3, STRIDES, 2, 56, 1.0, True, "avg")
    assert y.dtype == dtype
    expected = multi_level_roi_align([f.float() for f in features], rois.float(), 3, STRIDES, 2)
    torch.testing.assert_close(y, expected.to(dtype), rtol=0, atol=0)
    # backward too
    leaves = [f.clone().requires_grad_() for f in features]
    multi_level_roi_align(leaves, rois, 3, STRIDES, 2).float().sum().backward()
    assert all(f.grad.dtype == dtype for f in leaves)


def test_autocast_runs_in_float32():
    features = make_features(dtype=torch.float32)
    rois = make_rois(8, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = multi_level_roi_align([f.bfloat16() for f in features], rois.bfloat16(), 2, STRIDES)
    assert y.dtype == torch.bfloat16
    expected = multi_level_roi_align([f.bfloat16().float() for f in features], rois.bfloat16().float(), 2, STRIDES)
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------------------------
# Gradients and the torch.library contract


@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("roi_scale_factor", [1.0, 1.3])
def test_backward_matches_reference(pool_mode, roi_scale_factor):
    base = make_features()
    rois = make_rois(25)
    g = torch.randn(25, 3, 2, 3, dtype=torch.float64)
    a = [f.clone().requires_grad_() for f in base]
    b = [f.clone().requires_grad_() for f in base]
    multi_level_roi_align(a, rois, (2, 3), STRIDES, 2, 56, roi_scale_factor, True, pool_mode).backward(g)
    reference(b, rois, (2, 3), STRIDES, 2, 56, roi_scale_factor, True, pool_mode).backward(g)
    for fa, fb in zip(a, b):
        torch.testing.assert_close(fa.grad, fb.grad, rtol=1e-12, atol=1e-12)
    assert all(f.grad.abs().sum() > 0 for f in a)  # the RoIs reach every level


@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [True, False])
def test_gradcheck(pool_mode, aligned):
    strides = [4.0, 8.0, 16.0]
    g = torch.Generator().manual_seed(3)
    features = [torch.randn(2, 2, 48 // int(s), 40 // int(s), generator=g, dtype=torch.float64, requires_grad=True)
                for s in strides]
    rois = torch.tensor([[0, 3.1, 2.2, 12.7, 9.3], [1, 1.4, 4.3, 37.2, 39.9], [0, 2.5, 1.5, 70.3, 75.1],
                         [1, 5.3, 3.7, 30.1, 21.2]], dtype=torch.float64)
    assert set(reference_levels(rois, 16, 3).tolist()) == {0, 1, 2}

    def fn(*fs):
        return multi_level_roi_align(list(fs), rois, (2, 2), strides, 2, 16, 1.1, aligned, pool_mode)

    assert torch.autograd.gradcheck(fn, tuple(features))


@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_opcheck(pool_mode):
    features = [f.requires_grad_() for f in make_features(c=2)]
    rois = make_rois(12)
    args = (features, rois, 2, 3, STRIDES, 2, 56, 1.0, True, pool_mode)
    torch.library.opcheck(torch.ops.dcnkit.multi_level_roi_align.default, args)
    g = torch.randn(12, 2, 2, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.dcnkit._multi_level_roi_align_backward.default,
                          (g, [f.detach() for f in features], rois, 2, 3, STRIDES, 2, 56, 1.0, True, pool_mode))


def test_torch_compile_fullgraph():
    features = make_features(dtype=torch.float32)
    rois = make_rois(9, dtype=torch.float32)

    def fn(fs, r):
        return multi_level_roi_align(fs, r, 3, STRIDES, 2) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(features, rois), fn(features, rois))


def test_torch_export_dynamic_rois():
    class Pool(torch.nn.Module):
        def forward(self, f0, f1, f2, f3, rois):
            return multi_level_roi_align([f0, f1, f2, f3], rois, 3, STRIDES, 2)

    features = make_features(dtype=torch.float32)
    rois = make_rois(9, dtype=torch.float32)
    k = torch.export.Dim("k", min=1, max=1000)
    ep = torch.export.export(Pool(), (*features, rois), dynamic_shapes=(None, None, None, None, {0: k}))
    assert any("multi_level_roi_align" in str(n.target) for n in ep.graph.nodes)
    rois2 = make_rois(17, dtype=torch.float32, seed=5)
    torch.testing.assert_close(ep.module()(*features, rois2), Pool()(*features, rois2))


def test_torchscript_and_fx():
    class Pool(torch.nn.Module):
        def forward(self, fs: list[torch.Tensor], rois):
            return multi_level_roi_align(fs, rois, [2, 2], [4.0, 8.0, 16.0, 32.0], 0, 56, 1.0, True, "max")

    features = make_features(dtype=torch.float32)
    rois = make_rois(6, dtype=torch.float32)
    eager = Pool()(features, rois)
    scripted = torch.jit.script(Pool())
    torch.testing.assert_close(scripted(features, rois), eager)

    class Pool4(torch.nn.Module):
        def forward(self, f0, f1, f2, f3, rois):
            return multi_level_roi_align([f0, f1, f2, f3], rois, 2, STRIDES)

    gm = torch.fx.symbolic_trace(Pool4())
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [multi_level_roi_align]
    torch.testing.assert_close(gm(*features, rois), Pool4()(*features, rois))


# ------------------------------------------------------------------------------------------------
# Bad input


def test_bad_levels_and_strides():
    features = make_features(n=1, c=2, dtype=torch.float32)
    rois = torch.tensor([[0.0, 1, 1, 20, 20]])
    op = torch.ops.dcnkit.multi_level_roi_align
    with pytest.raises(ValueError, match=r"multi_level_roi_align: features: expected 1 to 8 feature maps, got 0"):
        multi_level_roi_align([], rois, 2, [])
    with pytest.raises(ValueError, match=r"multi_level_roi_align: features: expected 1 to 8 feature maps, got 0"):
        op([], rois, 2, 2, [], 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"features: expected 1 to 8 feature maps, got 9"):
        op([features[0]] * 9, rois, 2, 2, [4.0] * 9, 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"featmap_strides: expected one stride per feature map \(4 values\), "
                                         r"got 3 values"):
        multi_level_roi_align(features, rois, 2, STRIDES[:3])
    with pytest.raises(ValueError, match=r"featmap_strides: expected one stride per feature map \(4 values\), got 3"):
        op(features, rois, 2, 2, STRIDES[:3], 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"featmap_strides\[1\]: expected a finite stride > 0, got 0"):
        multi_level_roi_align(features, rois, 2, [4.0, 0.0, 16.0, 32.0])
    with pytest.raises(ValueError, match=r"featmap_strides\[3\]: expected a finite stride > 0, got -32"):
        op(features, rois, 2, 2, [4.0, 8.0, 16.0, -32.0], 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"featmap_strides\[0\]: expected a finite stride > 0, got nan"):
        op(features, rois, 2, 2, [float("nan"), 8.0, 16.0, 32.0], 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"featmap_strides: expected a list of floats, got float"):
        multi_level_roi_align(features, rois, 2, 4.0)
    with pytest.raises(ValueError, match=r"features: expected a list of Tensor"):
        multi_level_roi_align(features[0], rois, 2, STRIDES)


def test_bad_maps():
    features = make_features(n=2, c=3, dtype=torch.float32)
    rois = torch.tensor([[0.0, 1, 1, 20, 20]])
    op = torch.ops.dcnkit.multi_level_roi_align
    bad = list(features)
    bad[2] = features[2][:, :2]
    with pytest.raises(ValueError, match=r"features\[2\]: expected 3 channels \(those of features\[0\]\), got 2"):
        multi_level_roi_align(bad, rois, 2, STRIDES)
    bad = list(features)
    bad[1] = features[1][:1]
    with pytest.raises(ValueError, match=r"features\[1\]: expected batch size 2 \(that of features\[0\]\), got 1"):
        op(bad, rois, 2, 2, STRIDES, 0, 56, 1.0, True, "avg")
    bad = list(features)
    bad[3] = features[3][0]
    with pytest.raises(ValueError, match=r"features\[3\]: expected 4-D tensor \(N, C, H, W\), got 3-D"):
        op(bad, rois, 2, 2, STRIDES, 0, 56, 1.0, True, "avg")
    bad = list(features)
    bad[1] = features[1].double()
    with pytest.raises(TypeError, match=r"features\[1\]: expected dtype Float \(the dtype of features\[0\]\), "
                                        r"got Double"):
        op(bad, rois, 2, 2, STRIDES, 0, 56, 1.0, True, "avg")
    with pytest.raises(TypeError, match=r"rois: expected dtype Float \(the dtype of features\[0\]\), got Double"):
        op(features, rois.double(), 2, 2, STRIDES, 0, 56, 1.0, True, "avg")
    with pytest.raises(TypeError, match=r"input: expected dtype float32, float64, float16 or bfloat16"):
        op([f.int() for f in features], rois.int(), 2, 2, STRIDES, 0, 56, 1.0, True, "avg")


def test_bad_attributes_and_rois():
    features = make_features(n=2, c=3, dtype=torch.float32)
    rois = torch.tensor([[0.0, 1, 1, 20, 20]])
    op = torch.ops.dcnkit.multi_level_roi_align
    with pytest.raises(ValueError, match=r"multi_level_roi_align: output_size: expected \(oh, ow\) >= 1, got \(0, 2\)"):
        op(features, rois, 0, 2, STRIDES, 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"output_size: expected an int or a pair"):
        multi_level_roi_align(features, rois, (1, 2, 3), STRIDES)
    with pytest.raises(ValueError, match=r"pool_mode: expected 'avg' or 'max', got 'sum'"):
        multi_level_roi_align(features, rois, 2, STRIDES, pool_mode="sum")
    with pytest.raises(ValueError, match=r"multi_level_roi_align: pool_mode: expected 'avg' or 'max', got 'mean'"):
        op(features, rois, 2, 2, STRIDES, 0, 56, 1.0, True, "mean")
    with pytest.raises(ValueError, match=r"finest_scale: expected an int > 0, got 0"):
        multi_level_roi_align(features, rois, 2, STRIDES, finest_scale=0)
    with pytest.raises(ValueError, match=r"roi_scale_factor: expected a finite value.*got inf"):
        multi_level_roi_align(features, rois, 2, STRIDES, roi_scale_factor=float("inf"))
    with pytest.raises(ValueError, match=r"rois: expected size 5 at dim 1.*got 4"):
        multi_level_roi_align(features, rois[:, :4].contiguous(), 2, STRIDES)
    with pytest.raises(ValueError, match=r"rois: expected 2-D tensor"):
        multi_level_roi_align(features, rois[0], 2, STRIDES)
    bad = torch.tensor([[0.0, 1, 1, 20, 20], [2.0, 1, 1, 20, 20]])
    with pytest.raises(ValueError, match=r"multi_level_roi_align: rois\[1, 0\] \(batch index\): expected a value "
                                         r"in \[0, 2\).*got 2"):
        multi_level_roi_align(features, bad, 2, STRIDES)
    g = torch.ones(2, 3, 2, 2)
    with pytest.raises(ValueError, match=r"_multi_level_roi_align_backward: rois\[1, 0\] \(batch index\)"):
        torch.ops.dcnkit._multi_level_roi_align_backward(g, features, bad, 2, 2, STRIDES, 0, 56, 1.0, True, "avg")
    with pytest.raises(ValueError, match=r"_multi_level_roi_align_backward: grad_output: expected shape "
                                         r"\[1, 3, 2, 2\], got \[2, 3, 2, 2\]"):
        torch.ops.dcnkit._multi_level_roi_align_backward(g, features, rois, 2, 2, STRIDES, 0, 56, 1.0, True, "avg")


# ------------------------------------------------------------------------------------------------
# CUDA (skipped without a device)


@pytest.mark.cuda
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(pool_mode, dtype):
    features = make_features(dtype=dtype)
    rois = make_rois(30, dtype=dtype)
    g = torch.randn(30, 3, 3, 3, dtype=dtype)
    fc = [f.clone().requires_grad_() for f in features]
    fd = [f.cuda().requires_grad_() for f in features]
    yc = multi_level_roi_align(fc, rois, 3, STRIDES, 0, 56, 1.2, True, pool_mode)
    yd = multi_level_roi_align(fd, rois.cuda(), 3, STRIDES, 0, 56, 1.2, True, pool_mode)
    torch.testing.assert_close(yd.cpu(), yc)
    yc.backward(g)
    yd.backward(g.cuda())
    for a, b in zip(fd, fc):
        torch.testing.assert_close(a.grad.cpu(), b.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_forward_backward(dtype):
    features = make_features(dtype=torch.float32)
    rois = make_rois(20, dtype=torch.float32)
    fd = [f.cuda().to(dtype).requires_grad_() for f in features]
    y = multi_level_roi_align(fd, rois.cuda().to(dtype), 3, STRIDES, 2)
    assert y.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    fe = [f.to(dtype).float().requires_grad_() for f in features]
    expected = multi_level_roi_align(fe, rois.to(dtype).float(), 3, STRIDES, 2)
    torch.testing.assert_close(y.float().cpu(), expected, rtol=tol, atol=tol)
    g = torch.randn(expected.shape)
    y.backward(g.cuda().to(dtype))
    expected.backward(g)
    for a, b in zip(fd, fe):
        assert a.grad.dtype == dtype
        torch.testing.assert_close(a.grad.float().cpu(), b.grad, rtol=tol, atol=tol)
