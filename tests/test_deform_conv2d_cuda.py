"""deform_conv2d on CUDA against the CPU path (float32, float64, float16/bfloat16 forward), CUDA gradcheck, empty
batch and devices. Skipped without a CUDA device. Inputs and configurations: test_deform_conv2d.py."""
from __future__ import annotations

import pytest
import torch

from test_deform_conv2d import CONFIGS, make_inputs, run

def _cuda_vs_cpu(dtype, rtol, atol, cfg, backward):
    n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b = cfg
    a = make_inputs(n, cin, h, w, cout, kh, kw, s, p, d, g, gd, mod, b, dtype=torch.float32, seed=21)
    ac = {k: (v.to("cuda", dtype) if isinstance(v, torch.Tensor) else v) for k, v in a.items()}
    y = run(a)
    yc = run(ac)
    assert yc.dtype == dtype and yc.is_cuda
    torch.testing.assert_close(yc.float().cpu(), y, rtol=rtol, atol=atol * y.abs().max().item())
    if backward:
        names = [k for k in ("input", "offset", "weight", "bias", "mask") if a[k] is not None]
        la = {k: a[k].clone().requires_grad_() for k in names}
        lc = {k: ac[k].clone().requires_grad_() for k in names}
        gy = torch.randn(y.shape)
        run(dict(a, **la)).backward(gy)
        run(dict(ac, **lc)).backward(gy.to("cuda", dtype))
        for k in names:
            ref_g = la[k].grad
            torch.testing.assert_close(lc[k].grad.float().cpu(), ref_g, rtol=rtol,
                                       atol=atol * max(1.0, ref_g.abs().max().item()), msg=lambda m: f"{k}: {m}")


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", CONFIGS)
def test_cuda_fp32_matches_cpu(cfg):
    _cuda_vs_cpu(torch.float32, 1e-5, 1e-5, cfg, backward=True)


@pytest.mark.cuda
@pytest.mark.parametrize("cfg", CONFIGS[:3])
def test_cuda_fp64_matches_cpu(cfg):
    _cuda_vs_cpu(torch.float64, 1e-5, 1e-5, cfg, backward=True)


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", CONFIGS[:3])
def test_cuda_half_forward_matches_cpu(dtype, cfg):
    # fp16: storage rounding of inputs and output (rel. 2^-11) plus GEMM in fp16 with fp32 accumulation;
    # bf16 has 8 bits of mantissa. Tolerances relative to the output's largest magnitude.
    tol = 1e-2 if dtype == torch.float16 else 4e-2
    _cuda_vs_cpu(dtype, tol, tol, cfg, backward=False)


@pytest.mark.cuda
def test_cuda_gradcheck():
    a = make_inputs(1, 4, 5, 5, 4, 3, 3, (1, 1), (1, 1), (1, 1), 2, 2, True, True, off_grid=True, device="cuda")
    names = ["input", "offset", "weight", "bias", "mask"]
    leaves = [a[k].clone().requires_grad_() for k in names]
    # The CUDA backward scatters with float64 atomic adds: a repeated backward may differ in the last bits
    # (gradcheck's reentrancy check), by ~1e-15 relative; nondet_tol states that, far below atol.
    assert torch.autograd.gradcheck(lambda *ts: run(dict(a, **dict(zip(names, ts)))), leaves, eps=1e-6,
                                    atol=1e-6, rtol=1e-4, nondet_tol=1e-12)


@pytest.mark.cuda
def test_cuda_empty_batch_and_bad_device():
    a = make_inputs(0, 4, 5, 5, 3, 3, 3, device="cuda")
    assert run(a).shape == (0, 3, 5, 5)
    b = make_inputs(1, 4, 5, 5, 3, 3, 3)
    b["offset"] = b["offset"].cuda()
    with pytest.raises(ValueError, match=r"deform_conv2d: offset: expected a tensor on cpu"):
        run(b)
