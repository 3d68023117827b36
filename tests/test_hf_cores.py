"""The kit's stand-ins for transformers' three deformable-attention cores (dcnkit/integrations/_hf_cores.py)
against transformers' own functions, forward and backward in float64: the module's forward, the function
(Mask2Former / OneFormer) and the v2 layout (RT-DETR v2 / D-FINE) with equal and unequal point counts per level,
method "default" and "discrete"."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from transformers.models.d_fine import modeling_d_fine  # noqa: E402
from transformers.models.deformable_detr import modeling_deformable_detr  # noqa: E402
from transformers.models.mask2former import modeling_mask2former  # noqa: E402

from dcnkit.integrations import _hf_cores  # noqa: E402

LEVELS = [(6, 7), (3, 4), (2, 2), (1, 1)]
N, LQ, M, D = 2, 5, 2, 4


def _value(dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    s = sum(h * w for h, w in LEVELS)
    return torch.randn(N, s, M, D, generator=g, dtype=dtype)


def _locs(*shape, dtype=torch.float64, seed=1):
    g = torch.Generator().manual_seed(seed)
    # Around the maps, some points outside (zeros there), none on a cell boundary.
    return torch.rand(*shape, generator=g, dtype=dtype) * 1.3 - 0.15


def _weights(*shape, dtype=torch.float64, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(*shape, generator=g, dtype=dtype)


def _grads(fn, *inputs):
    inputs = [t.clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out = fn(*inputs)
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
    return out.detach(), [t.grad for t in inputs if t.is_floating_point()]


def _check(ref, got, atol=1e-10):
    (r_out, r_grads), (g_out, g_grads) = ref, got
    torch.testing.assert_close(g_out, r_out, atol=atol, rtol=1e-9)
    assert len(r_grads) == len(g_grads)
    for r, g in zip(r_grads, g_grads):
        if r is None:
            assert g is None or not g.any()
        else:
            torch.testing.assert_close(g, r, atol=atol, rtol=1e-9)


def test_module_forward_matches_transformers():
    shapes = torch.tensor(LEVELS, dtype=torch.int64)
    starts = torch.tensor([0, 42, 54, 58], dtype=torch.int64)
    loc, w = _locs(N, LQ, M, len(LEVELS), 3, 2), _weights(N, LQ, M, len(LEVELS), 3)
    original = modeling_deformable_detr.MultiScaleDeformableAttention()
    ref = _grads(lambda v, lo, ww: original(v, shapes, LEVELS, starts, lo, ww, 64), _value(), loc, w)
    got = _grads(lambda v, lo, ww: _hf_cores.msda_module_forward(None, v, shapes, LEVELS, starts, lo, ww, 64),
                 _value(), loc, w)
    _check(ref, got)


def test_function_matches_transformers():
    loc, w = _locs(N, LQ, M, len(LEVELS), 4, 2), _weights(N, LQ, M, len(LEVELS), 4)
    ref = _grads(lambda v, lo, ww: modeling_mask2former.multi_scale_deformable_attention(v, LEVELS, lo, ww),
                 _value(), loc, w)
    got = _grads(lambda v, lo, ww: _hf_cores.multi_scale_deformable_attention(v, LEVELS, lo, ww), _value(), loc, w)
    _check(ref, got)


@pytest.mark.parametrize("counts", [[3, 3, 3, 3], [4, 1, 3, 2]])
@pytest.mark.parametrize("method", ["default", "discrete"])
def test_v2_matches_transformers(counts, method):
    total = sum(counts)
    loc, w = _locs(N, LQ, M, total, 2), _weights(N, LQ, M, total)
    ref = _grads(lambda v, lo, ww: modeling_d_fine.multi_scale_deformable_attention_v2(v, LEVELS, lo, ww, counts,
                                                                                       method), _value(), loc, w)
    got = _grads(lambda v, lo, ww: _hf_cores.multi_scale_deformable_attention_v2(v, LEVELS, lo, ww, counts, method),
                 _value(), loc, w)
    _check(ref, got)


def test_v2_discrete_picks_transformers_pixel_at_the_borders():
    """Points exactly between pixels, on the last pixel's far edge and far outside: the same pixel as
    transformers' int64 cast and clamp (float32, as models run)."""
    levels, counts = [(3, 4)], [6]
    value = torch.arange(12, dtype=torch.float32).reshape(1, 12, 1, 1)
    xs = torch.tensor([0.125, 0.25, 0.5, 1.0, -3.0, 7.0])  # x*W + 0.5 = 1.0, 1.5, 2.5, 4.5, ...
    loc = torch.stack([xs, torch.full_like(xs, 0.5)], -1).reshape(1, 1, 1, 6, 2)
    w = torch.eye(6).reshape(6, 1, 1, 6)
    for i in range(6):
        args = (value, levels, loc, w[i].reshape(1, 1, 1, 6), counts, "discrete")
        ref = modeling_d_fine.multi_scale_deformable_attention_v2(*args)
        got = _hf_cores.multi_scale_deformable_attention_v2(*args)
        assert got.item() == pytest.approx(ref.item(), abs=1e-5), i


@pytest.mark.parametrize("kwargs, message", [
    (dict(method="nearest"), "method: expected 'default' or 'discrete', got 'nearest'"),
    (dict(num_points_list=[3, 3]), "num_points_list: expected 4 counts >= 1"),
    (dict(num_points_list=[3, 3, 3, 2]), "expected sum(num_points_list) = 11 points, got 12"),
])
def test_v2_bad_arguments_name_themselves(kwargs, message):
    args = dict(value=_value(), value_spatial_shapes=LEVELS, sampling_locations=_locs(N, LQ, M, 12, 2),
                attention_weights=_weights(N, LQ, M, 12), num_points_list=[3, 3, 3, 3], method="default")
    args.update(kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        _hf_cores.multi_scale_deformable_attention_v2(**args)


def test_function_refuses_bad_level_list():
    with pytest.raises(ValueError, match="value_spatial_shapes: expected a list of \\(H, W\\) pairs"):
        _hf_cores.multi_scale_deformable_attention(_value(), [1, 2], _locs(N, LQ, M, 4, 4, 2),
                                                   _weights(N, LQ, M, 4, 4))


def test_v2_compiles_fullgraph_with_gradients(counts=(4, 1, 3, 2)):
    """torch.compile (fake kernels, autograd, no graph break) over the v2 stand-in, padding included."""
    total = sum(counts)
    loc, w = _locs(N, LQ, M, total, 2, dtype=torch.float32), _weights(N, LQ, M, total, dtype=torch.float32)
    fn = torch.compile(_hf_cores.multi_scale_deformable_attention_v2, backend="aot_eager", fullgraph=True)
    ref = _grads(lambda v, lo, ww: _hf_cores.multi_scale_deformable_attention_v2(v, LEVELS, lo, ww, counts),
                 _value(torch.float32), loc, w)
    got = _grads(lambda v, lo, ww: fn(v, LEVELS, lo, ww, counts), _value(torch.float32), loc, w)
    _check(ref, got, atol=1e-6)
