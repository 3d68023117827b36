"""CUDA backward in float16 and bfloat16 (float32 accumulation) against the CPU float32 path.

Inputs are rounded to the 16-bit type first and the CPU computes in float32 on exactly those values, so the
difference is the CUDA path's own error: 16-bit storage of the outputs, gradients and (DCN) columns, GEMMs in
the 16-bit type with float32 compute. Tolerances are relative to each tensor's largest magnitude."""
import pytest
import torch

from cuda_op_cases import CASE_NAMES, case, forward_backward

pytestmark = pytest.mark.cuda

TOL = {torch.float16: 1e-2, torch.bfloat16: 5e-2}


def _check(name, dtype, n=3):
    _, fn, data, diff = case(name, n=n)
    rounded = [t.to(dtype) for t in data]
    shape = fn(*[t.float() for t in rounded]).shape
    gy = torch.randn(shape, generator=torch.Generator().manual_seed(5)).to(dtype)
    y_ref, grads_ref, _ = forward_backward(fn, [t.float() for t in rounded], diff, grad_output=gy.float())
    y, grads, _ = forward_backward(fn, [t.cuda() for t in rounded], diff, grad_output=gy.cuda())
    tol = TOL[dtype]
    assert y.dtype == dtype
    torch.testing.assert_close(y.float().cpu(), y_ref, rtol=tol, atol=tol * max(1.0, y_ref.abs().max().item()))
    for i, (g, r) in enumerate(zip(grads, grads_ref)):
        if r is None:
            continue
        assert g.dtype == dtype and g.is_cuda
        torch.testing.assert_close(g.float().cpu(), r, rtol=tol, atol=tol * max(1.0, r.abs().max().item()),
                                   msg=lambda m: f"{name} {dtype}: grad of input {i}: {m}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name", [n for n in CASE_NAMES if "max" not in n])
def test_cuda_16bit_backward_matches_cpu_float32(name, dtype):
    # (max pooling is left out: a 16-bit tie-break may pick another arg-max sample than float32 does)
    _check(name, dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_16bit_dcn_grad_weight_sums_many_images_in_float32(dtype):
    # grad_weight is a sum of one GEMM per image, accumulated in float32 across the 32 images.
    _check("deform_conv2d_v1", dtype, n=32)


def test_cuda_float16_loss_backward_gives_float16_gradients():
    # A model cast to half trains: a float32 loss of a float16 output back-propagates into float16 gradients
    # of every input, finite and non-zero.
    _, fn, data, diff = case("deform_conv2d_v2")
    leaves = [t.to("cuda", torch.float16).requires_grad_(d) for t, d in zip(data, diff)]
    loss = fn(*leaves).float().square().mean()
    loss.backward()
    for t in leaves:
        assert t.grad is not None and t.grad.dtype == torch.float16
        assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_cuda_double_forward_is_not_narrowed_to_float():
    # float64 on CUDA keeps double precision everywhere (issue: im2col stored through a float).
    _, fn, data, diff = case("deform_conv2d_v2")
    y_cpu, g_cpu, gy = forward_backward(fn, data, diff)
    y, g, _ = forward_backward(fn, [t.cuda() for t in data], diff, grad_output=gy.cuda())
    torch.testing.assert_close(y.cpu(), y_cpu, rtol=1e-12, atol=1e-12)
    for a, b in zip(g, g_cpu):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-11, atol=1e-11)
