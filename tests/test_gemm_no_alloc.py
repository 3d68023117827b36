"""The torch adapter's GEMM (aten_gemm in plugins/torch/torch_common.cpp) writes straight into C: no C-sized
temporary and no copy (issue 25 item 4; GPU-DESIGN proxy (e)). It is the same function for CPU and CUDA tensors,
so the CPU run of the CUDA schedule (DCNKIT_DCN_CPU_PATH=cuda-schedule, DCNKIT_NO_DIRECT_BLAS=1: every GEMM
through aten_gemm) checks it: torch.profiler's memory events must show no allocation inside any
"dcnkit::aten_gemm" scope, over a bias-free forward (beta 0) and a backward (column-gradient GEMM with beta 0,
grad_weight GEMM with beta 1). The result is checked against torchvision too, so the GEMMs did run."""

import os
import subprocess
import sys
import textwrap

import pytest

tv = pytest.importorskip("torchvision", reason="torchvision gives the reference values")

_CHILD = textwrap.dedent("""
    import json, sys, torch, torchvision
    from torch.profiler import profile, ProfilerActivity
    from torch._C._profiler import _EventType
    from dcnkit.ops import deform_conv2d
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 9, 9, dtype=torch.float64, generator=g, requires_grad=True)
    off = (torch.randn(2, 18, 9, 9, dtype=torch.float64, generator=g) * 2).requires_grad_()
    w = torch.randn(6, 8, 3, 3, dtype=torch.float64, generator=g, requires_grad=True)
    m = torch.rand(2, 9, 9, 9, dtype=torch.float64, generator=g, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        y = deform_conv2d(x, off, w, None, 1, 1, 1, m)
        y.square().sum().backward()
    found = {"scopes": 0, "allocs": []}
    def walk(n, inside):
        here = inside or n.name == "dcnkit::aten_gemm"
        if n.name == "dcnkit::aten_gemm":
            found["scopes"] += 1
        if n.tag == _EventType.Allocation and inside and n.typed[1].alloc_size > 0:
            found["allocs"].append(n.typed[1].alloc_size)
        for c in n.children:
            walk(c, here)
    for r in prof.profiler.kineto_results.experimental_event_tree():
        walk(r, False)
    leaves = [t.detach().clone().requires_grad_() for t in (x, off, w, m)]
    yt = torchvision.ops.deform_conv2d(leaves[0], leaves[1], leaves[2], None, 1, 1, 1, leaves[3])
    yt.square().sum().backward()
    found["max_err"] = max([(y - yt).abs().max().item()] + [(a.grad - b.grad).abs().max().item()
                           for a, b in zip((x, off, w, m), leaves)])
    print(json.dumps(found))
""")


def test_aten_gemm_allocates_nothing():
    env = dict(os.environ, DCNKIT_DCN_CPU_PATH="cuda-schedule", DCNKIT_NO_DIRECT_BLAS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD], env=env, check=True, capture_output=True, text=True,
                         timeout=300).stdout
    import json

    found = json.loads(out.strip().splitlines()[-1])
    # Forward: one GEMM per tile; backward: grad_weight and column-gradient GEMMs per tile.
    assert found["scopes"] >= 3, found
    assert found["allocs"] == [], f"allocations inside dcnkit::aten_gemm: {found['allocs']}"
    assert found["max_err"] < 1e-9, found
