"""The CUDA launchers of DeformConv2d run on the CPU (DCNKIT_DCN_CPU_PATH=cuda-schedule: their column tiles, GEMM
arguments and per-thread bodies over the launch grid; DCNKIT_NO_DIRECT_BLAS=1: every GEMM through the torch
adapter's aten_gemm, the function the CUDA path uses too), in one child process, checked against torchvision:

* the boundary contract (issue 26 item 6): a bilinear neighbour outside the map is never read, a neighbour inside
  the map is read even with weight 0. With Inf in pixel (0, 0), sampling points at the far borders (whose missing
  neighbours an index-0 fallback would read) stay finite, and every value and gradient equals torchvision's,
  NaN and Inf where torchvision has them;
* the torch adapter's GEMM writes straight into C (issue 25 item 4): torch.profiler's memory
  events show no allocation inside any "dcnkit::aten_gemm" scope over a bias-free forward (beta 0) and a backward
  (column-gradient GEMM with beta 0, grad_weight GEMM with beta 1);
* sizes past the gather's 32-bit coordinates (H + 2*pad_h >= 2^31 here) are refused with a clear error;
* every launch of the launcher's own tiling is checked against CUDA's limits (issue 37 item 2): at fp32 with bias,
  C = 64, 1x1 kernel and maps, N = 70,000 the forward runs and equals torchvision's."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("torchvision", reason="torchvision gives the reference values")

_CHILD = textwrap.dedent("""
    import json, torch, torchvision
    from torch.profiler import profile, ProfilerActivity
    from torch._C._profiler import _EventType
    from dcnkit.ops import deform_conv2d

    def grads(f, tensors):
        leaves = [t.detach().clone().requires_grad_() for t in tensors]
        y = f(*leaves)
        y.backward(torch.ones_like(y))
        return [y.detach()] + [t.grad for t in leaves]

    def ours(x, off, w, m):
        return deform_conv2d(x, off, w, None, 1, 1, 1, m)

    def tv(x, off, w, m):
        return torchvision.ops.deform_conv2d(x, off, w, None, 1, 1, 1, m)

    out = {}
    g = torch.Generator().manual_seed(0)
    # Boundary contract: Inf at (0, 0); offsets push the points of the last rows/columns to (H-1, H) x (W-1, W)
    # (their lower/right neighbours are outside), those of the first rows/columns to (-1, 0).
    N, C, H, W = 2, 4, 7, 6
    x = torch.randn(N, C, H, W, dtype=torch.float64, generator=g)
    x[:, :, 0, 0] = float("inf")
    off = torch.rand(N, 18, H, W, dtype=torch.float64, generator=g) * 0.9 + 0.05
    w = torch.randn(3, C, 3, 3, dtype=torch.float64, generator=g)
    m = torch.rand(N, 9, H, W, dtype=torch.float64, generator=g)
    a, b = grads(ours, (x, off, w, m)), grads(tv, (x, off, w, m))
    out["border_finite"] = bool(a[0][:, :, H - 2:, W - 2:].isfinite().all())
    out["tv_border_finite"] = bool(b[0][:, :, H - 2:, W - 2:].isfinite().all())
    out["nonfinite"] = [int((~t.isfinite()).sum()) for t in a]
    out["mismatch"] = []
    for name, p, q in zip(("y", "input", "offset", "weight", "mask"), a, b):
        try:
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-10, equal_nan=True)
        except AssertionError as e:
            out["mismatch"].append(name + ": " + str(e)[:300])

    # GEMM: no allocation inside aten_gemm.
    x = torch.randn(2, 8, 9, 9, dtype=torch.float64, generator=g, requires_grad=True)
    off = (torch.randn(2, 18, 9, 9, dtype=torch.float64, generator=g) * 2).requires_grad_()
    w = torch.randn(6, 8, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    m = torch.rand(2, 9, 9, 9, dtype=torch.float64, generator=g, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = ours(x, off, w, m)
        y.square().sum().backward()
    out["scopes"], out["allocs"] = 0, []
    def walk(n, inside):
        if n.name == "dcnkit::aten_gemm":
            out["scopes"] += 1
        if n.tag == _EventType.Allocation and inside and n.typed[1].alloc_size > 0:
            out["allocs"].append(n.typed[1].alloc_size)
        for c in n.children:
            walk(c, inside or n.name == "dcnkit::aten_gemm")
    for r in prof.profiler.kineto_results.experimental_event_tree():
        walk(r, False)
    ref = grads(lambda *t: tv(*t).square().sum(), (x, off, w, m))
    out["gemm_err"] = max((p - q).abs().max().item() for p, q in zip([x.grad, off.grad, w.grad, m.grad], ref[1:]))

    # The gather's 32-bit coordinates: a padded extent of 2^31 or more is refused, naming the sizes.
    try:
        deform_conv2d(torch.zeros(1, 1, 4, 4), torch.zeros(1, 18, 3, 4), torch.zeros(1, 1, 3, 3), None,
                      (2**30, 1), (2**30, 1), 1)
        out["bounds_error"] = ""
    except ValueError as e:
        out["bounds_error"] = str(e)

    # CUDA's launch limits (issue 37 item 2): fp32, bias, C = 64, a 1x1 kernel on 1x1 maps, N = 70,000. The CPU
    # schedule checks every launch of the launcher's own tiling (a tile of 65,536 images gave the bias kernel
    # gridDim.z = 65,536 and the GEMMs as many batches); the result equals torchvision's.
    x = torch.randn(70000, 64, 1, 1, generator=g)
    w = torch.randn(64, 64, 1, 1, generator=g) * 0.1
    b = torch.randn(64, generator=g)
    off = torch.randn(70000, 2, 1, 1, generator=g) * 0.3
    try:
        y = deform_conv2d(x, off, w, b, 1, 0, 1, None)
        out["n70000_err"] = (y - torchvision.ops.deform_conv2d(x, off, w, b)).abs().max().item()
    except Exception as e:  # noqa: BLE001 - reported by the test
        out["n70000_err"] = str(e)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def child():
    env = dict(os.environ, DCNKIT_DCN_CPU_PATH="cuda-schedule", DCNKIT_NO_DIRECT_BLAS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True, capture_output=True, text=True,
                         timeout=300).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_outside_neighbours_never_read(child):
    assert child["tv_border_finite"], "the case must put finite border samples next to the map's edge"
    assert child["border_finite"], child
    assert child["nonfinite"][0] > 0, "the case must also sample pixel (0, 0) with an in-map neighbour"
    assert child["mismatch"] == [], child["mismatch"]


def test_aten_gemm_allocates_nothing(child):
    # Forward: one GEMM per tile; backward: grad_weight and column-gradient GEMMs per tile.
    assert child["scopes"] >= 3, child
    assert child["allocs"] == [], f"allocations inside dcnkit::aten_gemm: {child['allocs']}"
    assert child["gemm_err"] < 1e-9, child


def test_sizes_past_32_bit_coordinates_are_refused(child):
    assert child["bounds_error"].startswith("deform_conv2d_cuda: input: expected an input plane H*W, H + 2*pad_h, "
                                            "W + 2*pad_w and a column row below 2^31 elements, got H*W 16, "
                                            "H + 2*pad_h 2147483652"), child["bounds_error"]


def test_launches_within_cuda_limits_at_70000_images(child):
    assert isinstance(child["n70000_err"], float) and child["n70000_err"] < 1e-4, child["n70000_err"]
