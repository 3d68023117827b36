"""deform_psroi_pool (R-FCN) against the NumPy reference (docs/operators.md), output and count; gradients, opcheck,
properties, edge cases and bad input."""
import pytest
import torch

import dcnkit  # noqa: F401
from dcnkit import reference as R
from dcnkit.ops import deform_psroi_pool
from hypothesis import given
from hypothesis import strategies as st

from test_roi_align import rand_rois

op = torch.ops.dcnkit.deform_psroi_pool


def ref(x, rois, trans, scale, P, D, G=1, part=None, spp=4, std=0.0):
    t = None if trans is None else trans.double().numpy()
    out, cnt = R.deform_psroi_pool(x.double().numpy(), rois.double().numpy(), t, scale, P, D, G, part, spp, std)
    return torch.from_numpy(out), torch.from_numpy(cnt)


@pytest.mark.parametrize("G", [1, 2, 3])
@pytest.mark.parametrize("num_classes", [0, 1, 2])  # 0: no trans
@pytest.mark.parametrize("part", [None, 2])
def test_matches_reference_float64(G, num_classes, part):
    D, P = 4, 3
    x = torch.randn(2, D * G * G, 11, 10, dtype=torch.float64)
    rois = rand_rois(5, 2, 11 / 0.6, 10 / 0.6)
    ps = P if part is None else part
    trans = torch.randn(5, 2 * num_classes, ps, ps, dtype=torch.float64) if num_classes else None
    y, cnt = op(x, rois, trans, 0.6, P, D, G, 0 if part is None else part, 3, 0.2)
    ry, rc = ref(x, rois, trans, 0.6, P, D, G, part, 3, 0.2)
    torch.testing.assert_close(y, ry, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(cnt, rc)
    torch.testing.assert_close(deform_psroi_pool(x, rois, trans, 0.6, P, D, G, part, 3, 0.2), ry)


def test_matches_reference_float32():
    x = torch.randn(2, 2 * 4, 12, 10)
    rois = rand_rois(5, 2, 12, 10, dtype=torch.float32)
    trans = torch.randn(5, 2, 3, 3)
    y = deform_psroi_pool(x, rois, trans, 1.0, 3, 2, 2, None, 4, 0.1)
    assert y.dtype == torch.float32 and y.shape == (5, 2, 3, 3)
    torch.testing.assert_close(y.double(), ref(x, rois, trans, 1.0, 3, 2, 2, None, 4, 0.1)[0], rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("num_classes", [0, 1, 2])
def test_gradcheck(num_classes):
    D, G, P = 2, 2, 3
    x = torch.randn(2, D * G * G, 7, 7, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(3, 2, 7, 7, inside=True)
    trans = None
    if num_classes:
        trans = (torch.rand(3, 2 * num_classes, 2, 2, dtype=torch.float64) - 0.5).requires_grad_()
        args = (x, trans)
        fn = lambda a, t: deform_psroi_pool(a, rois, t, 1.0, P, D, G, 2, 2, 0.1)  # noqa: E731
    else:
        args = (x,)
        fn = lambda a: deform_psroi_pool(a, rois, None, 1.0, P, D, G, 2, 2, 0.1)  # noqa: E731
    assert torch.autograd.gradcheck(fn, args)


def test_opcheck():
    x = torch.randn(2, 2 * 4, 8, 8, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(3, 2, 8, 8, inside=True)
    trans = (torch.rand(3, 2, 2, 2, dtype=torch.float64) * 0.2).requires_grad_()
    torch.library.opcheck(op.default, (x, rois, trans, 1.0, 2, 2, 2, 2, 2, 0.1))
    torch.library.opcheck(op.default, (x, rois, None, 1.0, 2, 2, 2, 0, 2, 0.0))
    y, cnt = op(x.detach(), rois, trans.detach(), 1.0, 2, 2, 2, 2, 2, 0.1)
    g = torch.randn_like(y)
    torch.library.opcheck(torch.ops.dcnkit._deform_psroi_pool_backward.default,
                          (g, x.detach(), rois, trans.detach(), cnt, 1.0, 2, 2, 2, 2, 2, 0.1))


@given(n=st.integers(1, 2), h=st.integers(1, 8), w=st.integers(1, 8), k=st.integers(0, 3),
       P=st.integers(1, 4), D=st.integers(1, 3), G=st.integers(1, 3), part=st.integers(0, 4),
       spp=st.integers(1, 3), scale=st.sampled_from([0.5, 1.0]), num_classes=st.integers(0, 3),
       std=st.sampled_from([0.0, 0.1, 1.0]), seed=st.integers(0, 2**16))
def test_property_matches_reference(n, h, w, k, P, D, G, part, spp, scale, num_classes, std, seed):
    if num_classes and D % num_classes:
        num_classes = 1
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, D * G * G, h, w, dtype=torch.float64, generator=g)
    rois = rand_rois(k, n, h, w, scale=scale, gen=g)
    ps = part if part > 0 else P
    trans = torch.randn(k, 2 * num_classes, ps, ps, dtype=torch.float64, generator=g) if num_classes else None
    y, cnt = op(x, rois, trans, scale, P, D, G, part, spp, std)
    ry, rc = ref(x, rois, trans, scale, P, D, G, part, spp, std)
    torch.testing.assert_close(y, ry, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(cnt, rc)


# ------------------------------------------------------------------------------------------------
# Edge cases


def test_zero_rois_and_empty_batch():
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    trans = torch.zeros(0, 2, 2, 2, requires_grad=True)
    y = deform_psroi_pool(x, torch.zeros(0, 5), trans, 1.0, 2, 1, 2, None, 2, 0.1)
    assert y.shape == (0, 1, 2, 2)
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x)) and trans.grad.shape == trans.shape
    assert deform_psroi_pool(torch.randn(0, 4, 5, 5), torch.zeros(0, 5), None, 1.0, 2, 1, 2).shape == (0, 1, 2, 2)


def test_rois_outside_give_zero_and_count_zero():
    x = torch.randn(1, 1, 6, 6, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, -30, -30, -20, -20], [0, 40, 1, 50, 3]], dtype=torch.float64)
    y, cnt = op(x, rois, None, 1.0, 2, 1, 1, 0, 2, 0.0)
    assert torch.equal(y, torch.zeros_like(y)) and torch.equal(cnt, torch.zeros_like(cnt))
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_non_finite_trans_and_boxes_are_skipped():
    x = torch.randn(1, 4, 6, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 1.0, 1, 4, 4], [0, float("nan"), 1, 4, 4], [0, 1, 1, float("inf"), 4]],
                        dtype=torch.float64)
    trans = torch.zeros(3, 2, 2, 2, dtype=torch.float64)
    trans[0, 0] = float("nan")
    y, cnt = op(x, rois, trans, 1.0, 2, 1, 2, 2, 2, 0.1)
    assert torch.isfinite(y).all()
    assert torch.equal(cnt[0], torch.zeros_like(cnt[0])) and torch.equal(cnt[1], torch.zeros_like(cnt[1]))


def test_tiny_rois_use_min_size():
    x = torch.randn(1, 1, 6, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 2, 2, 2, 2], [0, 3, 3, 1, 1]], dtype=torch.float64)
    y, cnt = op(x, rois, None, 0.01, 2, 1, 1, 0, 3, 0.0)
    ry, rc = ref(x, rois, None, 0.01, 2, 1, 1, None, 3, 0.0)
    torch.testing.assert_close(y, ry)
    torch.testing.assert_close(cnt, rc)


def test_non_contiguous_inputs():
    x = torch.randn(2, 7, 8, 4, dtype=torch.float64).permute(0, 3, 1, 2)  # (2, 4, 7, 8)
    rois = rand_rois(3, 2, 7, 8).t().contiguous().t()
    trans = torch.randn(3, 2, 2, 2, 2, dtype=torch.float64)[..., 1]
    assert not x.is_contiguous() and not rois.is_contiguous() and not trans.is_contiguous()
    y = deform_psroi_pool(x, rois, trans, 1.0, 2, 1, 2, None, 2, 0.3)
    torch.testing.assert_close(y, ref(x, rois, trans, 1.0, 2, 1, 2, None, 2, 0.3)[0])


def test_backward_reuses_forward_count():
    # The backward divides by the count it is given (the forward's), not by a recomputed one.
    x = torch.randn(1, 1, 6, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 1.0, 1, 4, 4]], dtype=torch.float64)
    y, cnt = op(x, rois, None, 1.0, 1, 1, 1, 0, 2, 0.0)
    g = torch.ones_like(y)
    gi1, _ = torch.ops.dcnkit._deform_psroi_pool_backward(g, x, rois, None, cnt, 1.0, 1, 1, 1, 0, 2, 0.0)
    gi2, _ = torch.ops.dcnkit._deform_psroi_pool_backward(g, x, rois, None, cnt * 2, 1.0, 1, 1, 1, 0, 2, 0.0)
    torch.testing.assert_close(gi1, gi2 * 2)
    assert gi1.sum().item() == pytest.approx(1.0)


# ------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input():
    x = torch.randn(2, 8, 6, 6)
    rois = torch.tensor([[0.0, 0, 0, 3, 3]])
    with pytest.raises(ValueError, match=r"deform_psroi_pool: rois\[0, 0\] \(batch index\): expected a value in "
                                         r"\[0, 2\).*got 2"):
        deform_psroi_pool(x, torch.tensor([[2.0, 0, 0, 3, 3]]), None, 1.0, 2, 2, 2)
    with pytest.raises(ValueError, match=r"batch index.*got nan"):
        deform_psroi_pool(x, torch.tensor([[float("nan"), 0, 0, 3, 3]]), None, 1.0, 2, 2, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: input: expected size 12 at dim 1 "
                                         r"\(output_dim \* group_size\^2 = 3 \* 2\^2\), got 8"):
        deform_psroi_pool(x, rois, None, 1.0, 2, 3, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: output_dim: expected a multiple of num_classes"
                                         r".* = 3, got 2"):
        deform_psroi_pool(x, rois, torch.zeros(1, 6, 2, 2), 1.0, 2, 2, 2, None, 4, 0.1)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: trans: expected an even size >= 2 at dim 1"):
        deform_psroi_pool(x, rois, torch.zeros(1, 3, 2, 2), 1.0, 2, 2, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: trans: expected size 3 at dim 2 \(part_size\)"):
        deform_psroi_pool(x, rois, torch.zeros(1, 2, 2, 2), 1.0, 2, 2, 2, 3)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: trans: expected size 1 at dim 0"):
        deform_psroi_pool(x, rois, torch.zeros(2, 2, 2, 2), 1.0, 2, 2, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: sample_per_part: expected a value >= 1, got 0"):
        deform_psroi_pool(x, rois, None, 1.0, 2, 2, 2, None, 0)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: group_size: expected a value >= 1, got 0"):
        deform_psroi_pool(x, rois, None, 1.0, 2, 2, 0)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: output_size: expected a value >= 1, got 0"):
        deform_psroi_pool(x, rois, None, 1.0, 0, 2, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: output_dim: expected a value >= 1, got 0"):
        deform_psroi_pool(x, rois, None, 1.0, 2, 0, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: spatial_scale: expected a finite value > 0, got inf"):
        deform_psroi_pool(x, rois, None, float("inf"), 2, 2, 2)
    with pytest.raises(ValueError, match=r"deform_psroi_pool: rois: expected 2-D tensor"):
        deform_psroi_pool(x, rois[0], None, 1.0, 2, 2, 2)
    with pytest.raises(TypeError, match=r"deform_psroi_pool: trans: expected dtype Float.*got Double"):
        deform_psroi_pool(x, rois, torch.zeros(1, 2, 2, 2, dtype=torch.float64), 1.0, 2, 2, 2)
    cnt = torch.zeros(1, 2, 2, 2)
    with pytest.raises(ValueError, match=r"_deform_psroi_pool_backward: count: expected shape \[1, 2, 2, 2\]"):
        torch.ops.dcnkit._deform_psroi_pool_backward(cnt, x, rois, None, cnt[:, :1], 1.0, 2, 2, 2, 0, 4, 0.0)


# ------------------------------------------------------------------------------------------------
# CUDA (skipped without a device)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(dtype):
    x = torch.randn(2, 2 * 4, 12, 11, dtype=dtype)
    rois = rand_rois(7, 2, 12, 11, dtype=dtype)
    trans = torch.randn(7, 2, 3, 3, dtype=dtype) * 0.3
    g = torch.randn(7, 2, 3, 3, dtype=dtype)
    xc, tc = x.clone().requires_grad_(), trans.clone().requires_grad_()
    xd, td = x.cuda().requires_grad_(), trans.cuda().requires_grad_()
    yc = deform_psroi_pool(xc, rois, tc, 1.0, 3, 2, 2, None, 3, 0.1)
    yd = deform_psroi_pool(xd, rois.cuda(), td, 1.0, 3, 2, 2, None, 3, 0.1)
    torch.testing.assert_close(yd.cpu(), yc)
    yc.backward(g)
    yd.backward(g.cuda())
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    torch.testing.assert_close(td.grad.cpu(), tc.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_forward(dtype):
    x = torch.randn(2, 2 * 4, 12, 11).to(dtype)
    rois = rand_rois(7, 2, 12, 11, dtype=torch.float32).to(dtype)
    trans = (torch.randn(7, 2, 3, 3) * 0.3).to(dtype)
    y = deform_psroi_pool(x.cuda(), rois.cuda(), trans.cuda(), 1.0, 3, 2, 2, None, 3, 0.1)
    expected = deform_psroi_pool(x.float(), rois.float(), trans.float(), 1.0, 3, 2, 2, None, 3, 0.1)
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(y.float().cpu(), expected, rtol=tol, atol=tol)
