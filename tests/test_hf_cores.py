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


_CORES = {  # call site -> (transformers' core, the kit's stand-in), as (value, locations, weights) -> output
    "module": (lambda v, lo, w: modeling_deformable_detr.MultiScaleDeformableAttention()(
                   v, torch.tensor(LEVELS), LEVELS, None, lo.reshape(*lo.shape[:3], len(LEVELS), 3, 2),
                   w.reshape(*w.shape[:3], len(LEVELS), 3), 64),
               lambda v, lo, w: _hf_cores.msda_module_forward(
                   None, v, torch.tensor(LEVELS), LEVELS, torch.tensor([0, 42, 54, 58]),
                   lo.reshape(*lo.shape[:3], len(LEVELS), 3, 2), w.reshape(*w.shape[:3], len(LEVELS), 3), 64)),
    "function": (lambda v, lo, w: modeling_mask2former.multi_scale_deformable_attention(
                     v, LEVELS, lo.reshape(*lo.shape[:3], len(LEVELS), 3, 2), w.reshape(*w.shape[:3], len(LEVELS), 3)),
                 lambda v, lo, w: _hf_cores.multi_scale_deformable_attention(
                     v, LEVELS, lo.reshape(*lo.shape[:3], len(LEVELS), 3, 2), w.reshape(*w.shape[:3], len(LEVELS), 3))),
    "v2": (lambda v, lo, w: modeling_d_fine.multi_scale_deformable_attention_v2(v, LEVELS, lo, w, [4, 1, 3, 4]),
           lambda v, lo, w: _hf_cores.multi_scale_deformable_attention_v2(v, LEVELS, lo, w, [4, 1, 3, 4])),
}


def _value_grad(core, batch):
    """The gradient reaching ``value`` (a non-leaf, as in the models) and its strides."""
    leaf = torch.randn(batch, sum(h * w for h, w in LEVELS), M, D, dtype=torch.float64, requires_grad=True)
    value, seen = leaf * 1.0, []
    value.register_hook(lambda g: seen.append(g) or None)
    out = core(value, _locs(batch, LQ, M, 12, 2), _weights(batch, LQ, M, 12))
    out.backward(torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape))
    return seen[0]


@pytest.mark.parametrize("site, batch", [("module", 1), ("function", 1), ("v2", 1), ("v2", 2)])
def test_value_gradient_has_transformers_layout(site, batch):
    """value's gradient comes back with the strides transformers' core gives it: the model's own backward kernels
    upstream then see the same tensors as in the original model. (The module's and v1 function's layout for a batch
    over one depends on the level shapes; the batch-norm fault below needs a batch of one.)"""
    ref, got = (_value_grad(core, batch) for core in _CORES[site])
    assert got.stride() == ref.stride(), (site, batch)
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-9)


def test_batch_norm_upstream_gets_the_original_gradients():
    """D-FINE's case in small: a batch-1 Conv + BatchNorm feature map, flattened and transposed into value. PyTorch's
    CPU batch-norm backward (2.14) misreads the channels-last gradient with a batch stride of C that a contiguous value
    gradient becomes there (its parameters' gradients came out wrong by their own size); with transformers' layout they
    equal the original's."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, M * D, 1), torch.nn.BatchNorm2d(M * D), torch.nn.SiLU()).double()
    net.eval()
    images = [torch.randn(1, 3, h, w, dtype=torch.float64) for h, w in LEVELS]
    loc, w = _locs(1, LQ, M, 12, 2), _weights(1, LQ, M, 12)
    grads = []
    for core in _CORES["v2"]:
        net.zero_grad()
        value = torch.cat([net(x).flatten(2).transpose(1, 2) for x in images], 1).reshape(1, -1, M, D)
        core(value, loc, w).mul(torch.linspace(-1, 1, LQ * M * D, dtype=torch.float64).reshape(1, LQ, M * D)).sum() \
            .backward()
        grads.append([p.grad.clone() for p in net.parameters()])
    for ref, got in zip(*grads):
        torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-9)


def test_level_tables_are_built_once_and_serve_inference_then_training():
    """Eager calls reuse the level tables (no host-to-device copy per layer on a GPU); tables first built under
    torch.inference_mode() are normal tensors, which a later call with gradients can save for its backward."""
    _hf_cores._TABLES.clear()
    loc, w = _locs(N, LQ, M, len(LEVELS), 4, 2), _weights(N, LQ, M, len(LEVELS), 4)
    with torch.inference_mode():
        first = _hf_cores.multi_scale_deformable_attention(_value(), LEVELS, loc, w)
    tables = _hf_cores._level_tables(LEVELS, torch.device("cpu"))
    assert tables is _hf_cores._level_tables([tuple(hw) for hw in LEVELS], torch.device("cpu"))
    assert not any(t.is_inference() for t in tables)
    torch.testing.assert_close(tables[1], torch.tensor([0, 42, 54, 58]))
    ref = _grads(lambda v, lo, ww: modeling_mask2former.multi_scale_deformable_attention(v, LEVELS, lo, ww),
                 _value(), loc, w)
    got = _grads(lambda v, lo, ww: _hf_cores.multi_scale_deformable_attention(v, LEVELS, lo, ww), _value(), loc, w)
    _check(ref, got)
    torch.testing.assert_close(first, ref[0], atol=1e-10, rtol=1e-9)


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
