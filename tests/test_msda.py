"""multi_scale_deformable_attn against the NumPy reference (dcnkit.reference) and the grid_sample formulation
(tests/msda_cases.py): values, gradients, gradcheck, opcheck, torch.compile / torch.export, TorchScript / fx,
dtypes, non-finite locations, bad level tables and bad input."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dcnkit import reference as R
from dcnkit.ops import multi_scale_deformable_attn as msda

from msda_cases import grid_sample_msda, level_tables, make_inputs

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")

OP = torch.ops.dcnkit.multi_scale_deformable_attn.default
BACKWARD = torch.ops.dcnkit._multi_scale_deformable_attn_backward.default


def numpy_reference(value, shapes, starts, loc, attn):
    return torch.from_numpy(R.multi_scale_deformable_attn(value.detach().double().numpy(), shapes.numpy(),
                                                          starts.numpy(), loc.detach().double().numpy(),
                                                          attn.detach().double().numpy()))


# ------------------------------------------------------------------------------------------------
# Values


def test_matches_numpy_reference_float64():
    value, shapes, starts, loc, attn = make_inputs()
    y = msda(value, shapes, starts, loc, attn)
    assert y.shape == (2, 7, 12) and y.dtype == torch.float64
    torch.testing.assert_close(y, numpy_reference(value, shapes, starts, loc, attn), rtol=1e-12, atol=1e-12)


def test_matches_grid_sample_float32_and_float64():
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        value, shapes, starts, loc, attn = make_inputs(sizes=((9, 7), (5, 4), (3, 2), (1, 1)), channels=33,
                                                       queries=11, points=3, dtype=dtype, seed=2)
        torch.testing.assert_close(msda(value, shapes, starts, loc, attn), grid_sample_msda(value, shapes, loc, attn),
                                   rtol=tol, atol=tol)


def test_gradients_match_grid_sample():
    value, shapes, starts, loc, attn = make_inputs(channels=35, seed=3)
    ours = [t.clone().requires_grad_() for t in (value, loc, attn)]
    theirs = [t.clone().requires_grad_() for t in (value, loc, attn)]
    g = torch.randn(2, 7, 3 * 35, dtype=torch.float64)
    msda(ours[0], shapes, starts, ours[1], ours[2]).backward(g)
    grid_sample_msda(theirs[0], shapes, theirs[1], theirs[2]).backward(g)
    for a, b, name in zip(ours, theirs, ("value", "sampling_locations", "attention_weights")):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_level_start_index_is_read():
    """Levels stored out of order: value_l starts where level_start_index says, not at the prefix sum."""
    value, shapes, starts, loc, attn = make_inputs(sizes=((2, 3), (4, 2)), seed=4)
    # Level 1's rows first, then level 0's.
    swapped = torch.cat([value[:, 6:], value[:, :6]], 1)
    y = msda(swapped, shapes, torch.tensor([8, 0]), loc, attn)
    torch.testing.assert_close(y, msda(value, shapes, starts, loc, attn), rtol=0, atol=0)


def test_pixel_convention_and_boundary():
    """pixel = loc * size - 0.5: loc at a pixel centre reads it exactly; half a pixel outside reads half of it;
    a whole pixel outside reads 0."""
    value = torch.arange(12, dtype=torch.float64).view(1, 12, 1, 1)  # one 3 x 4 map
    shapes, starts = level_tables([(3, 4)])
    pts = [((1.5 / 4, 0.5 / 3), 1.0), ((3.5 / 4, 2.5 / 3), 11.0), ((0.0, 0.5 / 3), 0.0), ((1.0, 0.5 / 3), 1.5),
           ((-0.25, 0.5), 0.0), ((0.5, 1.0 + 1 / 3), 0.0)]
    loc = torch.tensor([p for p, _ in pts], dtype=torch.float64).view(1, len(pts), 1, 1, 1, 2)
    attn = torch.ones(1, len(pts), 1, 1, 1, dtype=torch.float64)
    y = msda(value, shapes, starts, loc, attn).flatten()
    torch.testing.assert_close(y, torch.tensor([e for _, e in pts], dtype=torch.float64))


def test_nan_weight_of_a_sample_outside_is_not_read():
    """A sample outside its map contributes nothing, whatever its weight (mmcv's kernel skips it too)."""
    value, shapes, starts, loc, attn = make_inputs(seed=13)
    loc[:, :, :, :, 0] = 2.0  # far outside every level
    bad = attn.clone()
    bad[:, :, :, :, 0] = float("nan")
    torch.testing.assert_close(msda(value, shapes, starts, loc, bad), msda(value, shapes, starts, loc, attn), rtol=0,
                               atol=0)
    torch.testing.assert_close(msda(value, shapes, starts, loc, bad), numpy_reference(value, shapes, starts, loc, bad),
                               rtol=1e-12, atol=1e-12)


def test_non_finite_and_huge_locations_are_zero_samples():
    value, shapes, starts, loc, attn = make_inputs(seed=5)
    bad = loc.clone()
    bad[:, :, :, :, 0, 0] = float("nan")
    bad[:, :3, :, :, 1, 1] = 1e30
    bad[:, 3:, :, :, 1, 0] = -float("inf")
    keep = attn.clone()
    keep[:, :, :, :, 0] = 0  # the NaN points
    keep[:, :, :, :, 1] = 0  # the huge and infinite ones
    y = msda(value, shapes, starts, bad, attn)
    torch.testing.assert_close(y, msda(value, shapes, starts, loc, keep), rtol=0, atol=0)
    leaves = [t.clone().requires_grad_() for t in (value, bad, attn)]
    msda(leaves[0], shapes, starts, leaves[1], leaves[2]).sum().backward()
    for t in leaves:
        assert torch.isfinite(t.grad).all()
    assert not leaves[1].grad[:, :, :, :, :2].any() and not leaves[2].grad[:, :, :, :, :2].any()


def test_empty_queries_batch_and_channels():
    for kw in ({"queries": 0}, {"n": 0}, {"channels": 0}):
        value, shapes, starts, loc, attn = make_inputs(**kw)
        leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
        y = msda(leaves[0], shapes, starts, leaves[1], leaves[2])
        assert y.shape == (value.shape[0], loc.shape[1], value.shape[2] * value.shape[3])
        y.sum().backward()
        for t in leaves:
            assert t.grad.shape == t.shape and not t.grad.any()


def test_non_contiguous_inputs():
    value, shapes, starts, loc, attn = make_inputs(seed=6)
    value_nc = value.transpose(2, 3).contiguous().transpose(2, 3)
    loc_nc = torch.cat([loc, loc], -1)[..., :2]
    assert not value_nc.is_contiguous() and not loc_nc.is_contiguous()
    torch.testing.assert_close(msda(value_nc, shapes[:, :], starts, loc_nc, attn), msda(value, shapes, starts, loc, attn),
                               rtol=0, atol=0)


@given(levels=st.lists(st.tuples(st.integers(1, 5), st.integers(1, 5)), min_size=1, max_size=3),
       n=st.integers(1, 2), heads=st.integers(1, 3), channels=st.integers(1, 5), queries=st.integers(1, 4),
       points=st.integers(1, 3), seed=st.integers(0, 1000))
@settings(deadline=None)
def test_property_matches_numpy_reference_and_grid_sample_gradients(levels, n, heads, channels, queries, points, seed):
    value, shapes, starts, loc, attn = make_inputs(n, levels, heads, channels, queries, points, seed=seed, spread=0.5)
    ours = [t.clone().requires_grad_() for t in (value, loc, attn)]
    y = msda(ours[0], shapes, starts, ours[1], ours[2])
    torch.testing.assert_close(y, numpy_reference(value, shapes, starts, loc, attn), rtol=1e-12, atol=1e-12)
    # Gradients: those of the grid_sample formulation (autograd).
    theirs = [t.clone().requires_grad_() for t in (value, loc, attn)]
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(seed), dtype=y.dtype)
    y.backward(g)
    grid_sample_msda(theirs[0], shapes, theirs[1], theirs[2]).backward(g)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_computes_in_float32(dtype):
    value, shapes, starts, loc, attn = (t.to(dtype) if t.is_floating_point() else t
                                        for t in make_inputs(dtype=torch.float32))
    y = msda(value, shapes, starts, loc, attn)
    assert y.dtype == dtype
    torch.testing.assert_close(y, msda(value.float(), shapes, starts, loc.float(), attn.float()).to(dtype), rtol=0,
                               atol=0)
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    msda(leaves[0], shapes, starts, leaves[1], leaves[2]).float().sum().backward()
    assert all(t.grad.dtype == dtype for t in leaves)


@pytest.mark.parametrize("value_dtype,other", [(torch.float16, torch.float32), (torch.float64, torch.float32),
                                               (torch.float32, torch.float16), (torch.bfloat16, torch.float32)])
def test_locations_and_weights_take_the_dtype_of_value_as_in_mmcv(value_dtype, other):
    """mmcv's MultiScaleDeformableAttnFunction casts sampling_locations and attention_weights to value's dtype (a
    float16 value with float32 locations is DETR code under autocast); the gradients come back in the callers'
    dtypes."""
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32, seed=4)
    leaves = [t.to(d).requires_grad_() for t, d in ((value, value_dtype), (loc, other), (attn, other))]
    y = msda(leaves[0], shapes, starts, leaves[1], leaves[2])
    assert y.dtype == value_dtype
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(value_dtype)
    y.backward(g)
    assert [t.grad.dtype for t in leaves] == [value_dtype, other, other]
    # The same as the caller casting first (mmcv's type_as), and that against the grid_sample formulation.
    cast = [t.detach().to(value_dtype).requires_grad_() for t in leaves]
    y_cast = msda(cast[0], shapes, starts, cast[1], cast[2])
    y_cast.backward(g)
    torch.testing.assert_close(y, y_cast, rtol=0, atol=0)
    for ours, theirs in zip(leaves, cast):
        torch.testing.assert_close(ours.grad, theirs.grad.to(ours.grad.dtype), rtol=0, atol=0)
    ref = [t.detach().double().requires_grad_() for t in cast]
    want = grid_sample_msda(ref[0], shapes, ref[1], ref[2])
    want.backward(g.double())
    tol = 1e-10 if value_dtype == torch.float64 else 1e-5 if value_dtype == torch.float32 else 3e-2
    torch.testing.assert_close(y.double(), want, rtol=tol, atol=tol)
    torch.testing.assert_close(leaves[0].grad.double(), ref[0].grad, rtol=tol, atol=tol)


def test_autocast_runs_in_float32():
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = msda(value.bfloat16(), shapes, starts, loc.bfloat16(), attn.bfloat16())
    assert y.dtype == torch.bfloat16
    expected = msda(value.bfloat16().float(), shapes, starts, loc.bfloat16().float(), attn.bfloat16().float())
    torch.testing.assert_close(y.float(), expected, rtol=1e-2, atol=1e-2)


# ------------------------------------------------------------------------------------------------
# Gradients and the torch.library contract


def test_gradcheck():
    value, shapes, starts, loc, attn = make_inputs(n=1, sizes=((3, 4), (2, 2)), heads=2, channels=3, queries=3,
                                                   seed=7)
    leaves = [t.requires_grad_() for t in (value, loc, attn)]
    assert torch.autograd.gradcheck(lambda v, l, a: msda(v, shapes, starts, l, a), leaves)


def test_opcheck():
    value, shapes, starts, loc, attn = make_inputs(n=1, sizes=((3, 4), (2, 2)), channels=3, queries=3, seed=8)
    args = (value.requires_grad_(), shapes, starts, loc.requires_grad_(), attn.requires_grad_())
    torch.library.opcheck(OP, args)
    g = torch.randn(1, 3, 9, dtype=torch.float64)
    torch.library.opcheck(BACKWARD, (g, value.detach(), shapes, starts, loc.detach(), attn.detach()))


def test_torch_compile_fullgraph():
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32)

    def fn(v, s, i, l, a):
        return msda(v, s, i, l, a) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    y = compiled(leaves[0], shapes, starts, leaves[1], leaves[2])
    torch.testing.assert_close(y, fn(value, shapes, starts, loc, attn))
    y.sum().backward()
    torch.testing.assert_close(leaves[2].grad, torch.autograd.grad(fn(value, shapes, starts, loc, attn.requires_grad_()).sum(), attn)[0])


def test_torch_export_dynamic_queries():
    class Attn(torch.nn.Module):
        def forward(self, v, s, i, l, a):
            return msda(v, s, i, l, a)

    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32)
    q = torch.export.Dim("q", min=1, max=1000)
    ep = torch.export.export(Attn(), (value, shapes, starts, loc, attn),
                             dynamic_shapes=(None, None, None, {1: q}, {1: q}))
    assert any("multi_scale_deformable_attn" in str(n.target) for n in ep.graph.nodes)
    value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32, queries=13, seed=9)
    torch.testing.assert_close(ep.module()(value, shapes, starts, loc, attn), Attn()(value, shapes, starts, loc, attn))


def test_torchscript_and_fx():
    class Attn(torch.nn.Module):
        def forward(self, v, s, i, l, a):
            return msda(v, s, i, l, a, 32)

    inputs = make_inputs(dtype=torch.float32)
    eager = Attn()(*inputs)
    torch.testing.assert_close(torch.jit.script(Attn())(*inputs), eager)
    torch.testing.assert_close(torch.jit.trace(Attn(), inputs)(*inputs), eager)
    gm = torch.fx.symbolic_trace(Attn())
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [msda]
    torch.testing.assert_close(gm(*inputs), eager)
    with pytest.raises(Exception, match=r"im2col_step: expected an int >= 1, got 0"):
        torch.jit.script(msda)(*inputs, 0)


# ------------------------------------------------------------------------------------------------
# Bad input


def test_bad_level_tables_on_the_cpu():
    value, shapes, starts, loc, attn = make_inputs()
    cases = [
        (torch.tensor([[6, 5], [3, 4], [1, 1]]), starts,
         r"spatial_shapes: expected sum of H\*W equal to S = 44 \(value.s dim 1\), got 43 \(levels 6x5, 3x4, 1x1\)"),
        (torch.tensor([[6, 5], [-3, 4], [1, 2]]), starts, r"spatial_shapes\[1\]: expected sizes \(H, W\) >= 0, got "
                                                          r"\(H, W\) = \(-3, 4\)"),
        (shapes, torch.tensor([0, 30, 43]), r"level_start_index\[2\]: expected a start with start \+ H\*W <= S = 44"),
        (shapes, torch.tensor([0, -1, 42]), r"level_start_index\[1\]: expected a start"),
        (torch.tensor([[6, 5], [3, 4], [2, 2]]), torch.tensor([0, 30, 40]),  # overlapping levels
         r"spatial_shapes: expected sum of H\*W equal to S = 44 \(value's dim 1\), got more than 44"),
        (torch.tensor([[2**62, 2**62], [3, 4], [1, 2]]), starts, r"level_start_index\[0\]: expected a start"),
    ]
    for s, i, msg in cases:
        with pytest.raises(ValueError, match=msg):
            msda(value, s, i, loc, attn)
        with pytest.raises(ValueError, match=msg):
            BACKWARD(torch.zeros(2, 7, 12, dtype=torch.float64), value, s, i, loc, attn)


def test_bad_shapes_and_types():
    value, shapes, starts, loc, attn = make_inputs()
    op = "multi_scale_deformable_attn"
    cases = [
        ((value[0], shapes, starts, loc, attn), ValueError, r"value: expected 4-D tensor \(N, S, M, D\), got 3-D"),
        ((value, shapes[:, :1], starts, loc, attn), ValueError, r"spatial_shapes: expected size 2 at dim 1"),
        ((value, shapes[:0], starts[:0], loc, attn), ValueError, r"spatial_shapes: expected at least one level"),
        ((value, shapes, starts[:2], loc, attn), ValueError, r"level_start_index: expected size 3 at dim 0"),
        ((value, shapes, starts, loc[:, :, :2], attn), ValueError,
         r"sampling_locations: expected size 3 at dim 2 \(M, the heads of value\), got 2"),
        ((value, shapes, starts, loc[:1], attn), ValueError, r"sampling_locations: expected size 2 at dim 0"),
        ((value, shapes, starts, loc[..., :1], attn), ValueError, r"sampling_locations: expected size 2 at dim 5"),
        ((value, shapes, starts, loc, attn[..., :1]), ValueError, r"attention_weights: expected size 2 at dim 4"),
        ((value, shapes, starts, loc, attn[0]), ValueError, r"attention_weights: expected 5-D tensor"),
        ((value, shapes.int(), starts, loc, attn), TypeError, r"spatial_shapes: expected dtype int64, got Int"),
        ((value, shapes, starts.float(), loc, attn), TypeError, r"level_start_index: expected dtype int64, got Float"),
        ((value.int(), shapes, starts, loc, attn), TypeError, r"input: expected dtype float32, float64"),
        ((value.int(), shapes, starts, loc.float(), attn.float()), TypeError, r"input: expected dtype float32"),
    ]
    for args, exc, msg in cases:
        with pytest.raises(exc, match=f"{op}: {msg}"):
            msda(*args)
    # The op itself takes one floating dtype (the wrapper casts the locations and weights to value's, as mmcv).
    with pytest.raises(TypeError, match=f"{op}: sampling_locations: expected dtype Double \\(the dtype of value\\), "
                                        "got Float"):
        OP(value, shapes, starts, loc.float(), attn)
    with pytest.raises(ValueError, match=f"{op}: im2col_step: expected an int >= 1, got 0"):
        msda(value, shapes, starts, loc, attn, 0)
    with pytest.raises(ValueError, match=f"{op}: value: expected a Tensor, got list"):
        msda([1.0], shapes, starts, loc, attn)
    with pytest.raises(ValueError, match=r"_multi_scale_deformable_attn_backward: grad_output: expected shape "
                                         r"\[2, 7, 12\], got \[2, 7, 11\]"):
        BACKWARD(torch.zeros(2, 7, 11, dtype=torch.float64), value, shapes, starts, loc, attn)


# ------------------------------------------------------------------------------------------------
# CUDA (skipped without a device)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(dtype):
    value, shapes, starts, loc, attn = make_inputs(channels=37, dtype=dtype, seed=10)
    cpu = [t.clone().requires_grad_() for t in (value, loc, attn)]
    dev = [t.cuda().requires_grad_() for t in (value, loc, attn)]
    g = torch.randn(2, 7, 3 * 37, dtype=dtype)
    y = msda(cpu[0], shapes, starts, cpu[1], cpu[2])
    yd = msda(dev[0], shapes.cuda(), starts.cuda(), dev[1], dev[2])
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(yd.cpu(), y, rtol=tol, atol=tol)
    y.backward(g)
    yd.backward(g.cuda())
    for a, b in zip(dev, cpu):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=tol * 10, atol=tol * 10)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_forward_backward(dtype):
    value, shapes, starts, loc, attn = make_inputs(channels=32, dtype=torch.float32, seed=11)
    dev = [t.cuda().to(dtype).requires_grad_() for t in (value, loc, attn)]
    ref = [t.detach().float().requires_grad_() for t in dev]
    y = msda(dev[0], shapes.cuda(), starts.cuda(), dev[1], dev[2])
    yr = msda(ref[0], shapes.cuda(), starts.cuda(), ref[1], ref[2])
    assert y.dtype == dtype
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(y.float(), yr, rtol=tol, atol=tol)
    y.float().sum().backward()
    yr.sum().backward()
    for a, b in zip(dev, ref):
        assert a.grad.dtype == dtype
        torch.testing.assert_close(a.grad.float(), b.grad, rtol=tol * 5, atol=tol * 5)


@pytest.mark.cuda
@pytest.mark.parametrize("table", ["([[6, 5], [-3, 4], [2**40, 2**40]], [0, 30, -7])",  # entries out of range
                                   "([[6, 5], [3, 4], [1, 1]], [0, 30, 42])"])  # sum of H*W is S - 1
def test_cuda_bad_level_tables_are_an_asynchronous_device_assert(table):
    """On CUDA the tables are read on the device (no host copy): a bad table gives zeros and, as a bad RoI batch
    index, an asynchronous device-side assert at the next synchronisation (a subprocess: the assert leaves the CUDA
    context unusable). A valid table does not assert. (The CPU raises; ORT CUDA gives the zeros, test_ort_msda.py;
    the kernels' zeros also run on the CPU, test_cuda_schedule_cpu.py.)"""
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
        from dcnkit.ops import multi_scale_deformable_attn as msda
        from msda_cases import make_inputs
        value, shapes, starts, loc, attn = make_inputs(dtype=torch.float32, seed=12)
        if sys.argv[1] == "bad":
            shapes, starts = (torch.tensor(t) for t in {table})
        y = msda(value.cuda(), shapes.cuda(), starts.cuda(), loc.cuda(), attn.cuda())
        torch.cuda.synchronize()
        print("finished", float(y.abs().sum()) > 0)
    """)
    bad = subprocess.run([sys.executable, "-c", code, "bad"], capture_output=True, text=True, timeout=600)
    assert bad.returncode != 0 and "finished" not in bad.stdout, bad.stdout + bad.stderr
    assert "device-side assert" in bad.stderr, bad.stderr[-3000:]
    good = subprocess.run([sys.executable, "-c", code, "good"], capture_output=True, text=True, timeout=600)
    assert good.returncode == 0 and "finished True" in good.stdout, good.stdout + good.stderr
