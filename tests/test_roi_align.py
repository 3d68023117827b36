"""roi_align (avg | max) against the NumPy reference (docs/operators.md) and torchvision; gradients, opcheck,
properties, edge cases and bad input."""
import math

import numpy as np
import pytest
import torch

import dcnkit  # noqa: F401
from dcnkit import reference as R
from dcnkit.ops import roi_align

torchvision = pytest.importorskip("torchvision")
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


def rand_rois(k, n, h, w, scale=1.0, inside=False, dtype=torch.float64, gen=None):
    """K RoIs in image coordinates; inside=True keeps them well inside the (h, w) feature map."""
    g = gen or torch.Generator().manual_seed(1)
    bi = torch.randint(0, n, (k, 1), generator=g).to(dtype)
    if inside:
        x1 = 1.3 + torch.rand(k, 1, generator=g, dtype=dtype) * (w / 3)
        y1 = 1.3 + torch.rand(k, 1, generator=g, dtype=dtype) * (h / 3)
        x2 = x1 + 1.0 + torch.rand(k, 1, generator=g, dtype=dtype) * (w / 3)
        y2 = y1 + 1.0 + torch.rand(k, 1, generator=g, dtype=dtype) * (h / 3)
        return torch.cat([bi, x1 / scale, y1 / scale, x2 / scale, y2 / scale], 1)
    a = (torch.rand(k, 2, generator=g, dtype=dtype) * 1.4 - 0.2) * torch.tensor([w, h], dtype=dtype)
    b = a + torch.rand(k, 2, generator=g, dtype=dtype) * torch.tensor([w, h], dtype=dtype) * 0.8
    return torch.cat([bi, a / scale, b / scale], 1)


def ref(x, rois, out, scale, sr, aligned, mode):
    return torch.from_numpy(R.roi_align(x.double().numpy(), rois.double().numpy(), out, scale, sr, aligned,
                                        mode))


# ------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sr", [0, 2, -1])
@pytest.mark.parametrize("mode", ["avg", "max"])
def test_matches_reference_float64(aligned, sr, mode):
    x = torch.randn(2, 3, 9, 11, dtype=torch.float64)
    rois = rand_rois(6, 2, 9, 11, scale=0.7)
    y = roi_align(x, rois, (3, 2), 0.7, sr, aligned, mode)
    torch.testing.assert_close(y, ref(x, rois, (3, 2), 0.7, sr, aligned, mode), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_matches_reference_float32(mode):
    x = torch.randn(2, 4, 12, 10)
    rois = rand_rois(7, 2, 12, 10, dtype=torch.float32)
    y = roi_align(x, rois, 4, 1.0, 0, True, mode)
    assert y.dtype == torch.float32 and y.shape == (7, 4, 4, 4)
    torch.testing.assert_close(y.double(), ref(x, rois, 4, 1.0, 0, True, mode), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("aligned", [False, True])
@pytest.mark.parametrize("sr", [0, 2, -1])
def test_avg_matches_torchvision_fp32(aligned, sr):
    x = torch.randn(2, 5, 16, 13)
    rois = rand_rois(10, 2, 16, 13, scale=0.5, dtype=torch.float32)
    y = roi_align(x, rois, (5, 4), 0.5, sr, aligned)
    t = torchvision.ops.roi_align(x, rois, (5, 4), 0.5, sr, aligned)
    torch.testing.assert_close(y, t, rtol=1e-5, atol=1e-6)


def test_avg_backward_matches_torchvision():
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(5, 2, 10, 10)
    g = torch.randn(5, 3, 3, 3, dtype=torch.float64)
    (gx,) = torch.autograd.grad(roi_align(x, rois, 3, 1.0, 2, True), x, g)
    (tx,) = torch.autograd.grad(torchvision.ops.roi_align(x, rois, 3, 1.0, 2, True), x, g)
    torch.testing.assert_close(gx, tx, rtol=1e-10, atol=1e-12)


def test_max_backward_goes_to_argmax_sample():
    # One bin of 2 x 2 samples that fall exactly on the pixels (2..3, 2..3); the largest is (3, 2).
    x = torch.randn(1, 1, 6, 6, dtype=torch.float64)
    x[0, 0, 3, 2] = 10.0
    x.requires_grad_()
    rois = torch.tensor([[0, 2.0, 2.0, 4.0, 4.0]], dtype=torch.float64)  # aligned: start 1.5, size 2
    y = roi_align(x, rois, 1, 1.0, 2, True, "max")
    assert y.item() == 10.0
    (g,) = torch.autograd.grad(y.sum() * 3.0, x)
    expected = torch.zeros_like(x)
    expected[0, 0, 3, 2] = 3.0
    torch.testing.assert_close(g, expected)


@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [False, True])
def test_gradcheck(mode, aligned):
    x = torch.randn(2, 2, 8, 9, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(3, 2, 8, 9, inside=True)
    assert torch.autograd.gradcheck(lambda t: roi_align(t, rois, (2, 3), 1.0, 2, aligned, mode), (x,))


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_opcheck(mode):
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(4, 2, 8, 8, inside=True)
    torch.library.opcheck(torch.ops.dcnkit.roi_align.default, (x, rois, 2, 3, 1.0, 0, True, mode))
    g = torch.randn(4, 3, 2, 3, dtype=torch.float64)
    torch.library.opcheck(torch.ops.dcnkit._roi_align_backward.default,
                          (g, x.detach(), rois, 2, 3, 1.0, 0, True, mode))


@given(n=st.integers(1, 2), c=st.integers(1, 3), h=st.integers(1, 9), w=st.integers(1, 9),
       k=st.integers(0, 4), oh=st.integers(1, 3), ow=st.integers(1, 3), sr=st.integers(-1, 3),
       scale=st.sampled_from([0.25, 0.5, 1.0, 1.5]), aligned=st.booleans(),
       mode=st.sampled_from(["avg", "max"]), seed=st.integers(0, 2**16))
def test_property_matches_reference(n, c, h, w, k, oh, ow, sr, scale, aligned, mode, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, h, w, dtype=torch.float64, generator=g)
    rois = rand_rois(k, n, h, w, scale=scale, gen=g)
    y = roi_align(x, rois, (oh, ow), scale, sr, aligned, mode)
    assert y.shape == (k, c, oh, ow)
    torch.testing.assert_close(y, ref(x, rois, (oh, ow), scale, sr, aligned, mode), rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------------------------------
# Edge cases


def test_zero_rois_forward_and_backward():
    x = torch.randn(2, 3, 5, 5, requires_grad=True)
    rois = torch.zeros(0, 5)
    y = roi_align(x, rois, 2, 1.0, 2, True)
    assert y.shape == (0, 3, 2, 2)
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))


def test_empty_batch():
    x = torch.randn(0, 3, 5, 5, requires_grad=True)
    y = roi_align(x, torch.zeros(0, 5), 2)
    assert y.shape == (0, 3, 2, 2)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_rois_outside_the_map():
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    rois = torch.tensor([[0, -20, -20, -10, -10],  # fully outside: zeros
                         [0, 30, 2, 40, 4],
                         [0, -3, -3, 2, 2],  # partly outside
                         [0, 4, 4, 9, 12]], dtype=torch.float64)
    for mode in ("avg", "max"):
        y = roi_align(x, rois, 2, 1.0, 0, True, mode)
        assert torch.equal(y[:2], torch.zeros_like(y[:2]))
        torch.testing.assert_close(y, ref(x, rois, 2, 1.0, 0, True, mode))


def test_tiny_and_degenerate_rois():
    x = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    rois = torch.tensor([[0, 2, 2, 2, 2], [0, 3, 1, 3.01, 1.01], [0, 4, 4, 3, 3]], dtype=torch.float64)
    for aligned in (False, True):
        for sr in (0, 2):
            y = roi_align(x, rois, 2, 1.0, sr, aligned)
            torch.testing.assert_close(y, ref(x, rois, 2, 1.0, sr, aligned, "avg"))
            torch.testing.assert_close(y, torchvision.ops.roi_align(x, rois, 2, 1.0, sr, aligned))


@pytest.mark.parametrize("mode", ["avg", "max"])
def test_large_bins_and_partial_chunks(mode):
    # 1 bin of 19 x 19 samples (more than the CPU taps buffer: sampled on the fly), and 3 x 3 bins of
    # 10 x 10 samples (the buffer holds 2 bins: the last chunk is partial).
    x = torch.randn(2, 2, 20, 20, dtype=torch.float64, requires_grad=True)
    rois = torch.tensor([[0, 0.3, 0.2, 19.4, 19.1], [1, 0.0, 0.0, 30.0, 30.0]], dtype=torch.float64)
    g = torch.randn(2, 2, 1, 1, dtype=torch.float64)
    for out, sr in ((1, 0), (3, 10)):
        y = roi_align(x, rois, out, 1.0, sr, True, mode)
        torch.testing.assert_close(y, ref(x.detach(), rois, out, 1.0, sr, True, mode))
    y = roi_align(x, rois, 1, 1.0, 0, True, mode)
    (gx,) = torch.autograd.grad(y, x, g)
    if mode == "avg":
        (tx,) = torch.autograd.grad(torchvision.ops.roi_align(x, rois, 1, 1.0, 0, True), x, g)
        torch.testing.assert_close(gx, tx)
    else:
        assert torch.count_nonzero(gx[0, 0]) <= 4 and torch.count_nonzero(gx[1, 1]) <= 4


def test_non_finite_box_coordinates_sample_as_outside():
    x = torch.randn(1, 2, 6, 6)
    rois = torch.tensor([[0, float("nan"), 1, 3, 3], [0, 1, 1, float("inf"), 3],
                         [0, -float("inf"), 1, 3, float("nan")]])
    for sr in (0, 2):
        for mode in ("avg", "max"):
            y = roi_align(x, rois, 2, 1.0, sr, True, mode)
            assert torch.isfinite(y).all()


def test_non_contiguous_inputs():
    x = torch.randn(2, 9, 8, 3, dtype=torch.float64).permute(0, 3, 1, 2)  # (2, 3, 9, 8), not contiguous
    rois = rand_rois(4, 2, 9, 8).t().contiguous().t()
    assert not x.is_contiguous() and not rois.is_contiguous()
    y = roi_align(x, rois, 3, 1.0, 2, True)
    torch.testing.assert_close(y, ref(x, rois, 3, 1.0, 2, True, "avg"))


def test_list_of_boxes_form():
    x = torch.randn(2, 3, 10, 10)
    b0 = torch.tensor([[1.0, 1, 6, 7], [0.5, 2, 9, 9]])
    b1 = torch.tensor([[2.0, 3, 5, 8]])
    y = roi_align(x, [b0, b1], 3, 1.0, 2, True)
    rois = torch.tensor([[0, 1.0, 1, 6, 7], [0, 0.5, 2, 9, 9], [1, 2.0, 3, 5, 8]])
    torch.testing.assert_close(y, roi_align(x, rois, 3, 1.0, 2, True))
    torch.testing.assert_close(y, torchvision.ops.roi_align(x, [b0, b1], 3, 1.0, 2, True))


def test_output_size_forms():
    x = torch.randn(1, 1, 6, 6)
    rois = torch.tensor([[0, 1.0, 1, 5, 5]])
    assert roi_align(x, rois, 3).shape == (1, 1, 3, 3)
    assert roi_align(x, rois, (2, 4)).shape == (1, 1, 2, 4)
    assert roi_align(x, rois, [4, 1]).shape == (1, 1, 4, 1)


# ------------------------------------------------------------------------------------------------
# Bad input


def test_batch_index_out_of_range():
    x = torch.randn(2, 1, 4, 4)
    rois = torch.tensor([[0, 0, 0, 2, 2], [5, 0, 0, 2, 2]], dtype=torch.float32)
    with pytest.raises(ValueError, match=r"roi_align: rois\[1, 0\] \(batch index\): expected a value in "
                                         r"\[0, 2\).*got 5"):
        roi_align(x, rois, 2)
    rois[1, 0] = -1
    with pytest.raises(ValueError, match=r"batch index.*got -1"):
        roi_align(x, rois, 2)


def test_batch_index_nan():
    x = torch.randn(2, 1, 4, 4, requires_grad=True)
    rois = torch.tensor([[float("nan"), 0, 0, 2, 2]])
    with pytest.raises(ValueError, match=r"rois\[0, 0\] \(batch index\).*got nan"):
        roi_align(x, rois, 2)
    g = torch.ones(1, 1, 2, 2)
    with pytest.raises(ValueError, match=r"batch index"):
        torch.ops.dcnkit._roi_align_backward(g, x.detach(), rois, 2, 2, 1.0, 0, False, "avg")


def test_batch_index_on_empty_batch():
    x = torch.randn(0, 1, 4, 4)
    with pytest.raises(ValueError, match=r"expected a value in \[0, 0\)"):
        roi_align(x, torch.tensor([[0.0, 0, 0, 2, 2]]), 2)


def test_bad_pool_mode():
    x = torch.randn(1, 1, 4, 4)
    rois = torch.tensor([[0.0, 0, 0, 2, 2]])
    with pytest.raises(ValueError, match=r"pool_mode: expected 'avg' or 'max', got 'sum'"):
        roi_align(x, rois, 2, pool_mode="sum")
    with pytest.raises(ValueError, match=r"roi_align: pool_mode: expected 'avg' or 'max', got 'mean'"):
        torch.ops.dcnkit.roi_align(x, rois, 2, 2, 1.0, 0, False, "mean")


def test_bad_shapes_and_attributes():
    x = torch.randn(1, 1, 4, 4)
    rois = torch.tensor([[0.0, 0, 0, 2, 2]])
    op = torch.ops.dcnkit.roi_align
    with pytest.raises(ValueError, match=r"roi_align: rois: expected size 5 at dim 1.*got 4"):
        op(x, rois[:, :4].contiguous(), 2, 2, 1.0, 0, False, "avg")
    with pytest.raises(ValueError, match=r"roi_align: rois: expected 2-D tensor.*got 1-D"):
        op(x, rois[0], 2, 2, 1.0, 0, False, "avg")
    with pytest.raises(ValueError, match=r"roi_align: input: expected 4-D tensor.*got 3-D"):
        op(x[0], rois, 2, 2, 1.0, 0, False, "avg")
    with pytest.raises(ValueError, match=r"roi_align: output_size: expected \(oh, ow\) >= 1, got \(0, 2\)"):
        op(x, rois, 0, 2, 1.0, 0, False, "avg")
    with pytest.raises(ValueError, match=r"roi_align: spatial_scale: expected a finite value > 0, got 0"):
        op(x, rois, 2, 2, 0.0, 0, False, "avg")
    with pytest.raises(ValueError, match=r"spatial_scale: expected a finite value > 0, got nan"):
        op(x, rois, 2, 2, float("nan"), 0, False, "avg")
    with pytest.raises(ValueError, match=r"boxes: expected a Tensor\[K, 5\] or a list"):
        roi_align(x, rois[:, :4], 2)
    with pytest.raises(ValueError, match=r"boxes\[0\]: expected a Tensor\[L, 4\]"):
        roi_align(x, [rois], 2)


def test_bad_dtypes_and_devices():
    x = torch.randn(1, 1, 4, 4)
    with pytest.raises(TypeError, match=r"roi_align: rois: expected dtype Float.*got Double"):
        roi_align(x, torch.tensor([[0.0, 0, 0, 2, 2]], dtype=torch.float64), 2)
    with pytest.raises(TypeError, match=r"roi_align: rois: expected dtype Half.*got Float"):
        roi_align(x.half(), torch.tensor([[0.0, 0, 0, 2, 2]]), 2)
    with pytest.raises(TypeError, match=r"roi_align: input: expected dtype float32, float64, float16 or bfloat16 \(CPU\)"):
        roi_align(torch.ones(1, 1, 4, 4, dtype=torch.int32), torch.tensor([[0, 0, 0, 2, 2]], dtype=torch.int32), 2)
    g = torch.ones(1, 1, 3, 3)
    with pytest.raises(ValueError, match=r"_roi_align_backward: grad_output: expected shape \[1, 1, 2, 2\]"):
        torch.ops.dcnkit._roi_align_backward(g, x, torch.tensor([[0.0, 0, 0, 2, 2]]), 2, 2, 1.0, 0, False, "avg")


# ------------------------------------------------------------------------------------------------
# CUDA (skipped without a device)


@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["avg", "max"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_matches_cpu(mode, dtype):
    x = torch.randn(2, 4, 12, 11, dtype=dtype)
    rois = rand_rois(9, 2, 12, 11, dtype=dtype)
    g = torch.randn(9, 4, 3, 3, dtype=dtype)
    xc = x.clone().requires_grad_()
    xd = x.cuda().requires_grad_()
    yc = roi_align(xc, rois, 3, 1.0, 0, True, mode)
    yd = roi_align(xd, rois.cuda(), 3, 1.0, 0, True, mode)
    torch.testing.assert_close(yd.cpu(), yc)
    yc.backward(g)
    yd.backward(g.cuda())
    torch.testing.assert_close(xd.grad.cpu(), xc.grad)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_half_forward(dtype):
    x = torch.randn(2, 4, 12, 11)
    rois = rand_rois(9, 2, 12, 11, dtype=torch.float32)
    y = roi_align(x.cuda().to(dtype), rois.cuda().to(dtype), 3, 1.0, 2, True)
    tol = 1e-2 if dtype == torch.float16 else 5e-2
    expected = roi_align(x.to(dtype).float(), rois.to(dtype).float(), 3, 1.0, 2, True)
    torch.testing.assert_close(y.float().cpu(), expected, rtol=tol, atol=tol)

# A bad batch index on CUDA (zeros + an asynchronous device-side assert): test_cuda_roi_batch_index.py.
