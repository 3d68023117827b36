"""deform_roi_pool (mmcv semantics) against the NumPy reference (docs/operators.md); gradients, opcheck,
properties, edge cases and bad input."""
import pytest
import torch

import dcnkit  # noqa: F401
from dcnkit import reference as R
from dcnkit.ops import deform_roi_pool, roi_align
from hypothesis import given
from hypothesis import strategies as st

from test_roi_align import rand_rois


def ref(x, rois, offset, out, scale, sr, gamma):
    off = None if offset is None else offset.double().numpy()
    return torch.from_numpy(R.deform_roi_pool(x.double().numpy(), rois.double().numpy(), off, out, scale, sr,
                                              gamma))


@pytest.mark.parametrize("sr", [0, 2])
@pytest.mark.parametrize("with_offset", [False, True])
def test_matches_reference_float64(sr, with_offset):
    x = torch.randn(2, 3, 10, 9, dtype=torch.float64)
    rois = rand_rois(6, 2, 10, 9, scale=0.8)
    offset = torch.randn(6, 2, 3, 4, dtype=torch.float64) if with_offset else None
    y = deform_roi_pool(x, rois, offset, (3, 4), 0.8, sr, 0.2)
    torch.testing.assert_close(y, ref(x, rois, offset, (3, 4), 0.8, sr, 0.2), rtol=1e-12, atol=1e-12)


def test_matches_reference_float32():
    x = torch.randn(2, 4, 12, 10)
    rois = rand_rois(5, 2, 12, 10, dtype=torch.float32)
    offset = torch.randn(5, 2, 2, 2) * 0.5
    y = deform_roi_pool(x, rois, offset, 2)
    torch.testing.assert_close(y.double(), ref(x, rois, offset, 2, 1.0, 0, 0.1), rtol=1e-5, atol=1e-5)


def test_no_offset_is_aligned_roi_align():
    x = torch.randn(2, 3, 10, 10)
    rois = rand_rois(6, 2, 10, 10, dtype=torch.float32)
    zero = torch.zeros(6, 2, 3, 3)
    a = roi_align(x, rois, 3, 0.9, 2, aligned=True)
    torch.testing.assert_close(deform_roi_pool(x, rois, None, 3, 0.9, 2), a)
    torch.testing.assert_close(deform_roi_pool(x, rois, zero, 3, 0.9, 2), a)


@pytest.mark.parametrize("sr", [0, 2])
def test_gradcheck_input_and_offset(sr):
    x = torch.randn(2, 2, 9, 9, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(3, 2, 9, 9, inside=True)
    offset = (torch.rand(3, 2, 2, 2, dtype=torch.float64) * 0.4 - 0.2).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, o: deform_roi_pool(a, rois, o, 2, 1.0, sr, 0.1), (x, offset))


def test_gradcheck_large_bins():
    # 1 bin of 17 x 17 samples: more than the CPU taps buffer (sampled on the fly).
    x = torch.randn(1, 2, 18, 18, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 0.9, 1.2, 17.7, 17.6]], dtype=torch.float64)
    offset = torch.tensor([[[[0.013]], [[-0.021]]]], dtype=torch.float64, requires_grad=True)
    torch.testing.assert_close(deform_roi_pool(x, rois, offset, 1), ref(x.detach(), rois, offset.detach(), 1, 1.0, 0, 0.1))
    assert torch.autograd.gradcheck(lambda a, o: deform_roi_pool(a, rois, o, 1), (x, offset))


def test_gradcheck_without_offset():
    x = torch.randn(1, 2, 8, 8, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(2, 1, 8, 8, inside=True)
    assert torch.autograd.gradcheck(lambda a: deform_roi_pool(a, rois, None, 3, 1.0, 2), (x,))


def test_opcheck():
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(4, 2, 8, 8, inside=True)
    offset = (torch.rand(4, 2, 2, 3, dtype=torch.float64) * 0.2).requires_grad_()
    torch.library.opcheck(torch.ops.dcnkit.deform_roi_pool.default, (x, rois, offset, 2, 3, 1.0, 0, 0.1))
    torch.library.opcheck(torch.ops.dcnkit.deform_roi_pool.default, (x, rois, None, 2, 3, 1.0, 2, 0.1))
    g = torch.randn(4, 3, 2, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.dcnkit._deform_roi_pool_backward.default,
                          (g, x.detach(), rois, offset.detach(), 2, 3, 1.0, 0, 0.1))


@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 8), w=st.integers(1, 8),
       k=st.integers(0, 4), oh=st.integers(1, 3), ow=st.integers(1, 3), sr=st.integers(-1, 3),
       scale=st.sampled_from([0.5, 1.0, 1.5]), gamma=st.sampled_from([0.0, 0.1, 1.0]),
       with_offset=st.booleans(), seed=st.integers(0, 2**16))
def test_property_matches_reference(n, c, h, w, k, oh, ow, sr, scale, gamma, with_offset, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, dtype=torch.float64, generator=g)
    rois = rand_rois(k, n, h, w, scale=scale, gen=g)
    offset = torch.randn(k, 2, oh, ow, dtype=torch.float64, generator=g) if with_offset else None
    y = deform_roi_pool(x, rois, offset, (oh, ow), scale, sr, gamma)
    torch.testing.assert_close(y, ref(x, rois, offset, (oh, ow), scale, sr, gamma), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------------------------
# Edge cases


def test_zero_rois():
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    offset = torch.zeros(0, 2, 2, 2, requires_grad=True)
    y = deform_roi_pool(x, torch.zeros(0, 5), offset, 2)
    assert y.shape == (0, 3, 2, 2)
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x)) and offset.grad.shape == offset.shape


def test_empty_batch():
    x = torch.randn(0, 3, 5, 5)
    assert deform_roi_pool(x, torch.zeros(0, 5), None, 2).shape == (0, 3, 2, 2)


def test_non_finite_offsets_sample_as_outside():
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 1.0, 1, 4, 4]] * 3, dtype=torch.float64)
    offset = torch.zeros(3, 2, 2, 2, dtype=torch.float64)
    offset[0, 0] = float("nan")
    offset[1, 1] = float("inf")
    offset[2, 0] = -1e30
    offset.requires_grad_()
    y = deform_roi_pool(x, rois, offset, 2, 1.0, 2)
    assert torch.equal(y, torch.zeros_like(y))
    y.sum().backward()
    assert torch.isfinite(x.grad).all() and torch.equal(x.grad, torch.zeros_like(x.grad))


def test_offsets_far_outside_and_partly_outside():
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 1.0, 1, 4, 4], [0, -2, -2, 3, 3]], dtype=torch.float64)
    offset = torch.tensor([[[[50.0]], [[50.0]]], [[[-0.3]], [[0.2]]]], dtype=torch.float64)
    y = deform_roi_pool(x, rois, offset, 1, 1.0, 0, 0.5)
    assert torch.equal(y[0], torch.zeros_like(y[0]))
    torch.testing.assert_close(y, ref(x, rois, offset, 1, 1.0, 0, 0.5))


def test_non_contiguous_inputs():
    x = torch.randn(2, 8, 9, 3, dtype=torch.float64).permute(0, 3, 1, 2)
    rois = rand_rois(4, 2, 8, 9)
    offset = torch.randn(4, 2, 2, 2, 2, dtype=torch.float64)[..., 0]
    assert not x.is_contiguous() and not offset.is_contiguous()
    y = deform_roi_pool(x, rois, offset, 2, 1.0, 2)
    torch.testing.assert_close(y, ref(x, rois, offset, 2, 1.0, 2, 0.1))


# ------------------------------------------------------------------------------------------------
# Bad input


def test_bad_input():
    x = torch.randn(2, 1, 4, 4)
    rois = torch.tensor([[0.0, 0, 0, 2, 2]])
    with pytest.raises(ValueError, match=r"deform_roi_pool: rois\[0, 0\] \(batch index\): expected a value in "
                                         r"\[0, 2\).*got 3"):
        deform_roi_pool(x, torch.tensor([[3.0, 0, 0, 2, 2]]), None, 2)
    with pytest.raises(ValueError, match=r"batch index.*got nan"):
        deform_roi_pool(x, torch.tensor([[float("nan"), 0, 0, 2, 2]]), None, 2)
    with pytest.raises(ValueError, match=r"deform_roi_pool: offset: expected size 3 at dim 3 \(ow\), got 2"):
        deform_roi_pool(x, rois, torch.zeros(1, 2, 3, 2), 3)
    with pytest.raises(ValueError, match=r"deform_roi_pool: offset: expected size 1 at dim 0 .*got 2"):
        deform_roi_pool(x, rois, torch.zeros(2, 2, 3, 3), 3)
    with pytest.raises(ValueError, match=r"deform_roi_pool: offset: expected size 2 at dim 1"):
        deform_roi_pool(x, rois, torch.zeros(1, 1, 3, 3), 3)
    with pytest.raises(ValueError, match=r"deform_roi_pool: offset: expected 4-D tensor"):
        deform_roi_pool(x, rois, torch.zeros(1, 2, 3), 3)
    with pytest.raises(ValueError, match=r"deform_roi_pool: rois: expected size 5 at dim 1"):
        deform_roi_pool(x, torch.zeros(1, 4), None, 3)
    with pytest.raises(ValueError, match=r"deform_roi_pool: output_size: expected \(oh, ow\) >= 1, got \(3, 0\)"):
        deform_roi_pool(x, rois, None, (3, 0))
    with pytest.raises(ValueError, match=r"deform_roi_pool: spatial_scale: expected a finite value > 0, got -1"):
        deform_roi_pool(x, rois, None, 3, -1.0)
    with pytest.raises(ValueError, match=r"deform_roi_pool: gamma: expected a finite value, got inf"):
        deform_roi_pool(x, rois, torch.zeros(1, 2, 3, 3), 3, 1.0, 0, float("inf"))
    with pytest.raises(TypeError, match=r"deform_roi_pool: offset: expected dtype Float.*got Double"):
        deform_roi_pool(x, rois, torch.zeros(1, 2, 3, 3, dtype=torch.float64), 3)


# ------------------------------------------------------------------------------------------------
# CUDA (skipped without a device)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(dtype):
    x = torch.randn(2, 4, 12, 11, dtype=dtype)
    rois = rand_rois(9, 2, 12, 11, dtype=dtype)
    offset = torch.randn(9, 2, 3, 3, dtype=dtype) * 0.3
    g = torch.randn(9, 4, 3, 3, dtype=dtype)
    xc, oc = x.clone().requires_grad_(), offset.clone().requires_grad_()
    xd, od = x.cuda().requires_grad_(), offset.cuda().requires_grad_()
    yc = deform_roi_pool(xc, rois, oc, 3)
    yd = deform_roi_pool(xd, rois.cuda(), od, 3)
    torch.testing.assert_close(yd.cpu(), yc)
    yc.backward(g)
    yd.backward(g.cuda())
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)
    torch.testing.assert_close(od.grad.cpu(), oc.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_forward(dtype):
    x = torch.randn(2, 4, 12, 11).to(dtype)
    rois = rand_rois(9, 2, 12, 11, dtype=torch.float32).to(dtype)
    offset = (torch.randn(9, 2, 3, 3) * 0.3).to(dtype)
    y = deform_roi_pool(x.cuda(), rois.cuda(), offset.cuda(), 3)
    expected = deform_roi_pool(x.float(), rois.float(), offset.float(), 3)
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    torch.testing.assert_close(y.float().cpu(), expected, rtol=tol, atol=tol)
