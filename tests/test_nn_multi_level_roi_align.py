"""FPN poolers over the fused op: ``MultiScaleRoIAlign`` against torchvision's (the drop-in), and
``MultiLevelRoIAlign`` (mmdet's names) against a per-level loop over ``roi_align`` (mmdet's rule)."""
from collections import OrderedDict

import math

import pytest
import torch
import torchvision

from dcnkit.nn import MultiLevelRoIAlign, MultiScaleRoIAlign
from dcnkit.ops import roi_align


def _features(n=2, c=3, size=64, levels=("0", "1", "2", "3"), extra=True, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = OrderedDict()
    for i, k in enumerate(levels):
        s = size // 2 ** i
        x[k] = torch.randn(n, c, s, s, generator=g, dtype=dtype)
    if extra:  # torchvision's FPN adds a "pool" map that the box pooler does not use
        x["pool"] = torch.randn(n, c, 2, 2, generator=g, dtype=dtype)
    return x


def _boxes(k, image, generator, dtype=torch.float32):
    """k boxes of widely spread sizes (every level is hit) inside an image of image x image."""
    side = torch.exp(torch.empty(k, 2, dtype=torch.float64).uniform_(math.log(4), math.log(image), generator=generator))
    x1 = torch.rand(k, dtype=torch.float64, generator=generator) * (image - side[:, 0])
    y1 = torch.rand(k, dtype=torch.float64, generator=generator) * (image - side[:, 1])
    return torch.stack([x1, y1, x1 + side[:, 0], y1 + side[:, 1]], 1).to(dtype)


def _boundary_boxes(dtype=torch.float32):
    """Squares of side exactly 56 * 2**k and a hair below / above: the level boundaries of both rules."""
    rows = []
    for k in range(-1, 3):
        for side in (56 * 2.0 ** k, 56 * 2.0 ** k - 0.01, 56 * 2.0 ** k + 0.01):
            rows.append([1.0, 2.0, 1.0 + side, 2.0 + side])
    rows.append([5.0, 5.0, 5.0, 9.0])  # zero area: level 0 in both
    return torch.tensor(rows, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sampling_ratio,output_size", [(2, 7), (0, (3, 5)), (-1, 2)])
def test_multiscale_matches_torchvision(dtype, sampling_ratio, output_size):
    g = torch.Generator().manual_seed(1)
    x = _features(dtype=dtype)
    image = 256  # features 64 .. 8: scales 1/4 .. 1/32 as in a torchvision detector
    boxes = [torch.cat([_boxes(40, image, g, dtype), _boundary_boxes(dtype)]), _boxes(25, image, g, dtype)]
    shapes = [(image, image), (image - 20, image - 8)]
    tv = torchvision.ops.MultiScaleRoIAlign(["0", "1", "2", "3"], output_size, sampling_ratio)
    ours = MultiScaleRoIAlign(["0", "1", "2", "3"], output_size, sampling_ratio)
    want = tv(x, boxes, shapes)
    got = ours(x, boxes, shapes)
    assert got.shape == want.shape == (boxes[0].shape[0] + boxes[1].shape[0], 3, *torch.nn.modules.utils._pair(
        output_size))
    torch.testing.assert_close(got, want)
    assert ours.scales == tv.scales == [0.25, 0.125, 0.0625, 0.03125]
    assert ours.finest_scale == 56
    # A second call reuses the inferred scales, as torchvision's does.
    torch.testing.assert_close(ours(x, boxes[:1], shapes[:1]), tv(x, boxes[:1], shapes[:1]))


def test_multiscale_other_canonical_values_subset_and_single_level():
    g = torch.Generator().manual_seed(2)
    x = _features(levels=("a", "b", "c"), extra=False)
    boxes = [_boxes(50, 128, g)]
    for names, kw in [(["a", "b", "c"], dict(canonical_scale=112, canonical_level=3)),
                      (["b", "c"], {}),
                      (["c"], {})]:
        tv = torchvision.ops.MultiScaleRoIAlign(names, 4, 2, **kw)
        ours = MultiScaleRoIAlign(names, 4, 2, **kw)
        torch.testing.assert_close(ours(x, boxes, [(128, 128)]), tv(x, boxes, [(128, 128)]))


def test_multiscale_takes_maps_in_the_order_of_x_like_torchvision():
    x = _features(extra=False)
    shuffled = OrderedDict((k, x[k]) for k in ("0", "1", "2", "3"))
    boxes = [_boxes(20, 256, torch.Generator().manual_seed(3))]
    tv = torchvision.ops.MultiScaleRoIAlign(["3", "2", "1", "0"], 2, 2)
    ours = MultiScaleRoIAlign(["3", "2", "1", "0"], 2, 2)
    torch.testing.assert_close(ours(shuffled, boxes, [(256, 256)]), tv(shuffled, boxes, [(256, 256)]))


def test_multiscale_gradient_matches_torchvision():
    x = _features(dtype=torch.float64, extra=False)
    boxes = [_boxes(30, 256, torch.Generator().manual_seed(4), torch.float64)]
    xt = OrderedDict((k, v.clone().requires_grad_()) for k, v in x.items())
    xo = OrderedDict((k, v.clone().requires_grad_()) for k, v in x.items())
    w = torch.randn(30, 3, 7, 7, dtype=torch.float64)
    (torchvision.ops.MultiScaleRoIAlign(list(x), 7, 2)(xt, boxes, [(256, 256)]) * w).sum().backward()
    (MultiScaleRoIAlign(list(x), 7, 2)(xo, boxes, [(256, 256)]) * w).sum().backward()
    for k in x:
        torch.testing.assert_close(xo[k].grad, xt[k].grad)


def test_multiscale_errors():
    x = _features()
    boxes = [torch.tensor([[0.0, 0.0, 10.0, 10.0]])]
    with pytest.raises(ValueError, match=r"MultiScaleRoIAlign: featmap_names: expected a non-empty list of str"):
        MultiScaleRoIAlign("0", 7, 2)
    with pytest.raises(ValueError, match=r"MultiScaleRoIAlign: output_size: expected a positive int or a pair"):
        MultiScaleRoIAlign(["0"], 0, 2)
    m = MultiScaleRoIAlign(["0", "1"], 7, 2)
    with pytest.raises(ValueError, match=r"MultiScaleRoIAlign: image_shapes: expected a non-empty list"):
        m(x, boxes, [])
    with pytest.raises(ValueError, match=r"MultiScaleRoIAlign: boxes\[0\]: expected a Tensor\[K, 4\], got \[1, 5\]"):
        m(x, [torch.zeros(1, 5)], [(256, 256)])
    with pytest.raises(ValueError, match=r"MultiScaleRoIAlign: x: expected maps named among \['0', '1'\]"):
        m({"p2": x["0"]}, boxes, [(256, 256)])
    # Levels 0 and 2 without 1: torchvision would pool zeros for boxes of level 1; refused.
    with pytest.raises(ValueError, match=r"MultiScaleRoIAlign: x: expected consecutive pyramid levels"):
        MultiScaleRoIAlign(["0", "2"], 7, 2)(x, boxes, [(256, 256)])
    with pytest.raises(ValueError, match=r"canonical_scale: expected canonical_scale \* 2\*\*\(k_min - canonical_level\)"):
        MultiScaleRoIAlign(["0", "1"], 7, 2, canonical_scale=100, canonical_level=5)(x, boxes, [(256, 256)])


def _mmdet_reference(feats, rois, output_size, strides, sampling_ratio, finest_scale, aligned, pool_mode,
                     roi_scale_factor=None):
    """mmdet's SingleRoIExtractor with mmdeploy's rescale, as a loop over levels with dcnkit's roi_align."""
    scale = torch.sqrt((rois[:, 3] - rois[:, 1]) * (rois[:, 4] - rois[:, 2]))
    lvls = torch.floor(torch.log2(scale / finest_scale + 1e-6)).clamp(0, len(feats) - 1).long()
    if roi_scale_factor is not None and roi_scale_factor > 0:
        cx, cy = (rois[:, 1] + rois[:, 3]) * 0.5, (rois[:, 2] + rois[:, 4]) * 0.5
        hw = (rois[:, 3] - rois[:, 1] + 1) * roi_scale_factor * 0.5 - 0.5
        hh = (rois[:, 4] - rois[:, 2] + 1) * roi_scale_factor * 0.5 - 0.5
        rois = torch.stack([rois[:, 0], cx - hw, cy - hh, cx + hw, cy + hh], 1)
    out = feats[0].new_zeros(rois.shape[0], feats[0].shape[1], *output_size)
    for i, (f, s) in enumerate(zip(feats, strides)):
        idx = torch.nonzero(lvls == i).flatten()
        if idx.numel():
            out[idx] = roi_align(f, rois[idx], output_size, 1.0 / s, sampling_ratio, aligned, pool_mode)
    return out


@pytest.mark.parametrize("aligned,pool_mode,roi_scale_factor", [
    (True, "avg", None), (False, "avg", 1.5), (True, "max", 2.0)])
def test_multi_level_matches_mmdet_loop(aligned, pool_mode, roi_scale_factor):
    g = torch.Generator().manual_seed(5)
    x = _features(dtype=torch.float64, extra=False)
    feats = list(x.values())
    b0, b1 = _boxes(30, 256, g, torch.float64), _boxes(20, 256, g, torch.float64)
    rois = torch.cat([torch.cat([torch.zeros(30, 1, dtype=torch.float64), b0], 1),
                      torch.cat([torch.ones(20, 1, dtype=torch.float64), b1], 1)])
    m = MultiLevelRoIAlign(7, [4, 8, 16, 32], sampling_ratio=2, finest_scale=56, aligned=aligned,
                           pool_mode=pool_mode)
    assert m.num_inputs == 4 and m.output_size == (7, 7)
    want = _mmdet_reference(feats, rois, (7, 7), [4, 8, 16, 32], 2, 56, aligned, pool_mode, roi_scale_factor)
    torch.testing.assert_close(m(feats, rois, roi_scale_factor), want)


def test_multi_level_defaults_and_errors():
    m = MultiLevelRoIAlign((2, 3), featmap_strides=[4, 8])
    assert (m.sampling_ratio, m.finest_scale, m.aligned, m.pool_mode) == (0, 56, True, "avg")
    with pytest.raises(ValueError, match=r"MultiLevelRoIAlign: featmap_strides: expected strides > 0, got \[4, 0\]"):
        MultiLevelRoIAlign(7, [4, 0])
    with pytest.raises(ValueError, match=r"MultiLevelRoIAlign: featmap_strides: expected a non-empty sequence"):
        MultiLevelRoIAlign(7, [])
    with pytest.raises(ValueError, match=r"MultiLevelRoIAlign: pool_mode: expected 'avg' or 'max', got 'min'"):
        MultiLevelRoIAlign(7, [4], pool_mode="min")
    with pytest.raises(ValueError, match=r"MultiLevelRoIAlign: finest_scale: expected an int >= 1, got 0"):
        MultiLevelRoIAlign(7, [4], finest_scale=0)
    with pytest.raises(ValueError, match=r"MultiLevelRoIAlign: feats: expected 2 maps \(one per featmap_strides\), "
                                         r"got 1"):
        m([torch.zeros(1, 2, 8, 8)], torch.zeros(0, 5))
