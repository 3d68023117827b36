"""dcnkit.nn.MultiScaleDeformableAttention: mmcv's parameter names and shapes (a state dict of mmcv's layout
loads with strict=True), mmcv's initialisation, and forward equal to the layer written out with the grid_sample
formulation (points and boxes as reference points, batch_first, key_padding_mask, query_pos, identity)."""
import math

import pytest
import torch
import torch.nn.functional as F

from dcnkit.nn import MultiScaleDeformableAttention

from msda_cases import grid_sample_msda, level_tables

# mmcv's MultiScaleDeformableAttention(embed_dims=256, num_heads=8, num_levels=4, num_points=4) state dict.
MMCV_KEYS = {
    "sampling_offsets.weight": (256, 256), "sampling_offsets.bias": (256,),
    "attention_weights.weight": (128, 256), "attention_weights.bias": (128,),
    "value_proj.weight": (256, 256), "value_proj.bias": (256,),
    "output_proj.weight": (256, 256), "output_proj.bias": (256,),
}


def test_state_dict_layout_and_strict_load():
    m = MultiScaleDeformableAttention()
    sd = m.state_dict()
    assert {k: tuple(v.shape) for k, v in sd.items()} == MMCV_KEYS
    assert list(sd) == list(MMCV_KEYS)
    g = torch.Generator().manual_seed(0)
    checkpoint = {k: torch.randn(s, generator=g) for k, s in MMCV_KEYS.items()}
    m.load_state_dict(checkpoint, strict=True)
    for k, v in checkpoint.items():
        assert torch.equal(m.state_dict()[k], v)
    small = MultiScaleDeformableAttention(embed_dims=64, num_heads=4, num_levels=3, num_points=2, value_proj_ratio=0.5)
    assert {k: tuple(v.shape) for k, v in small.state_dict().items()} == {
        "sampling_offsets.weight": (48, 64), "sampling_offsets.bias": (48,),
        "attention_weights.weight": (24, 64), "attention_weights.bias": (24,),
        "value_proj.weight": (32, 64), "value_proj.bias": (32,),
        "output_proj.weight": (64, 32), "output_proj.bias": (64,)}


def test_init_weights_as_mmcv():
    m = MultiScaleDeformableAttention(embed_dims=32, num_heads=4, num_levels=2, num_points=3)
    assert not m.sampling_offsets.weight.any() and not m.attention_weights.weight.any()
    assert not m.attention_weights.bias.any() and not m.value_proj.bias.any() and not m.output_proj.bias.any()
    bias = m.sampling_offsets.bias.view(4, 2, 3, 2)
    # Head h points in direction (cos, sin)(2*pi*h/4) scaled so the larger component is 1; point k is k+1 times out.
    dirs = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0], [0.0, -1.0]])
    for h in range(4):
        for lvl in range(2):
            for k in range(3):
                torch.testing.assert_close(bias[h, lvl, k], dirs[h] * (k + 1), atol=1e-6, rtol=0)
    bound = math.sqrt(6.0 / (32 + 32))  # xavier uniform
    assert m.value_proj.weight.abs().max() <= bound and m.value_proj.weight.std() > bound / 4


def reference_layer(m, query, value, reference_points, shapes, identity, key_padding_mask=None):
    """mmcv's forward written out with the grid_sample formulation (batch_first inputs, dropout off)."""
    n, lq, _ = query.shape
    v = F.linear(value, m.value_proj.weight, m.value_proj.bias)
    if key_padding_mask is not None:
        v = v.masked_fill(key_padding_mask[..., None], 0.0)
    v = v.view(n, value.shape[1], m.num_heads, -1)
    off = F.linear(query, m.sampling_offsets.weight, m.sampling_offsets.bias)
    off = off.view(n, lq, m.num_heads, m.num_levels, m.num_points, 2)
    a = F.linear(query, m.attention_weights.weight, m.attention_weights.bias)
    a = a.view(n, lq, m.num_heads, -1).softmax(-1).view(n, lq, m.num_heads, m.num_levels, m.num_points)
    if reference_points.shape[-1] == 2:
        wh = torch.stack([shapes[:, 1], shapes[:, 0]], -1).to(off.dtype)
        loc = reference_points[:, :, None, :, None, :] + off / wh[None, None, None, :, None, :]
    else:
        loc = (reference_points[:, :, None, :, None, :2]
               + off / m.num_points * reference_points[:, :, None, :, None, 2:] * 0.5)
    out = grid_sample_msda(v, shapes, loc, a)
    return F.linear(out, m.output_proj.weight, m.output_proj.bias) + identity


def _layer_inputs(n=2, lq=5, c=32, sizes=((6, 5), (3, 3)), ref_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes, starts = level_tables(sizes)
    S = int((shapes[:, 0] * shapes[:, 1]).sum())
    query = torch.randn(n, lq, c, generator=g, dtype=torch.float64)
    value = torch.randn(n, S, c, generator=g, dtype=torch.float64)
    ref = torch.rand(n, lq, len(sizes), ref_dim, generator=g, dtype=torch.float64)
    if ref_dim == 4:
        ref[..., 2:] *= 0.5
    return query, value, ref, shapes, starts


def _randomised(m, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.3)
    return m


@pytest.mark.parametrize("ref_dim", [2, 4])
def test_forward_matches_grid_sample_layer(ref_dim):
    m = _randomised(MultiScaleDeformableAttention(32, 4, 2, 3, batch_first=True, dropout=0.0).double()).eval()
    query, value, ref, shapes, starts = _layer_inputs(ref_dim=ref_dim)
    y = m(query, value=value, reference_points=ref, spatial_shapes=shapes, level_start_index=starts)
    torch.testing.assert_close(y, reference_layer(m, query, value, ref, shapes, query), rtol=1e-10, atol=1e-10)


def test_sequence_first_query_pos_identity_and_padding_mask():
    m = _randomised(MultiScaleDeformableAttention(32, 4, 2, 3, dropout=0.0).double()).eval()  # batch_first False
    query, value, ref, shapes, starts = _layer_inputs(seed=3)
    pos = torch.randn_like(query)
    identity = torch.randn_like(query)
    mask = torch.zeros(value.shape[:2], dtype=torch.bool)
    mask[1, -7:] = True
    y = m(query.transpose(0, 1), None, value.transpose(0, 1), identity.transpose(0, 1), pos.transpose(0, 1), mask,
          ref, shapes, starts)
    expected = reference_layer(m, query + pos, value, ref, shapes, identity, mask)
    torch.testing.assert_close(y, expected.transpose(0, 1), rtol=1e-10, atol=1e-10)
    # value defaults to query (self-attention over the flattened maps).
    q = torch.randn(value.shape[1], 2, 32, dtype=torch.float64)
    r = torch.rand(2, value.shape[1], 2, 2, dtype=torch.float64)
    torch.testing.assert_close(m(q, reference_points=r, spatial_shapes=shapes, level_start_index=starts),
                               reference_layer(m, q.transpose(0, 1), q.transpose(0, 1), r, shapes,
                                               q.transpose(0, 1)).transpose(0, 1), rtol=1e-10, atol=1e-10)


def test_gradients_reach_every_parameter():
    m = MultiScaleDeformableAttention(32, 4, 2, 3, batch_first=True).double()
    query, value, ref, shapes, starts = _layer_inputs(seed=4)
    m(query, value=value, reference_points=ref, spatial_shapes=shapes, level_start_index=starts).sum().backward()
    for name, p in m.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    assert m.sampling_offsets.weight.grad.any() and m.value_proj.weight.grad.any()


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"MultiScaleDeformableAttention: embed_dims: expected a multiple of "
                                         r"num_heads = 8, got 100"):
        MultiScaleDeformableAttention(100, 8)
    with pytest.raises(ValueError, match=r"MultiScaleDeformableAttention: num_points: expected an int >= 1, got 0"):
        MultiScaleDeformableAttention(num_points=0)
    with pytest.warns(UserWarning, match="not a power of 2"):
        MultiScaleDeformableAttention(48, 2)
    m = MultiScaleDeformableAttention(32, 4, 2, 3, batch_first=True)
    query, value, ref, shapes, starts = (t.float() if t.is_floating_point() else t for t in _layer_inputs())
    with pytest.raises(ValueError, match=r"reference_points: expected a last dim of 2 \(points\) or 4 \(boxes\)"):
        m(query, value=value, reference_points=ref[..., :1], spatial_shapes=shapes, level_start_index=starts)
    with pytest.raises(ValueError, match=r"reference_points, spatial_shapes and level_start_index: expected tensors"):
        m(query, value=value)
    with pytest.raises(ValueError, match=r"multi_scale_deformable_attn: level_start_index\[1\]: expected a start with start \+ H\*W <= S = 38"):
        m(query, value=value[:, :-1], reference_points=ref, spatial_shapes=shapes, level_start_index=starts)


def test_forward_keywords_have_mmcvs_meaning():
    """mmcv maps the deprecated residual= to identity= with a warning; the keywords its and mmdet's transformer
    layers pass (key_pos, attn_mask, valid_ratios) are unused there; anything else is a TypeError, never dropped."""
    m = _randomised(MultiScaleDeformableAttention(32, 4, 2, 3, batch_first=True, dropout=0.0).double()).eval()
    query, value, ref, shapes, starts = _layer_inputs(seed=6)
    t = torch.randn_like(query)
    kw = dict(value=value, reference_points=ref, spatial_shapes=shapes, level_start_index=starts)
    with pytest.warns(UserWarning, match=r'"residual" is deprecated in `MultiScaleDeformableAttention.forward`, '
                                         r'please use "identity" instead'):
        y = m(query, residual=t, **kw)
    torch.testing.assert_close(y, reference_layer(m, query, value, ref, shapes, t), rtol=1e-10, atol=1e-10)
    y = m(query, key_pos=torch.randn_like(query), attn_mask=torch.ones(5, 5, dtype=torch.bool),
          valid_ratios=torch.rand(2, 2, 2, dtype=torch.float64), **kw)
    torch.testing.assert_close(y, reference_layer(m, query, value, ref, shapes, query), rtol=1e-10, atol=1e-10)
    with pytest.raises(TypeError, match=r"MultiScaleDeformableAttention.forward: unexpected keyword argument\(s\) "
                                        r"'idenity'"):
        m(query, idenity=t, **kw)
    with pytest.raises(TypeError, match=r"residual: the deprecated name of identity, expected one of the two, "
                                        r"got both"):
        m(query, identity=t, residual=t, **kw)
