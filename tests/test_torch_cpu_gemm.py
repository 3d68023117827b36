"""The PyTorch CPU forward's packed GEMM (issue 46 item 6): DeformConv2d's float32 weight packed per call for
oneDNN's matmul, against the NumPy reference, with blocks of 64 rows, one narrower block (fewer than 64 output
channels), a padded last block, conv groups and the tiles split by rows; and the libtorch-BLAS path it replaces."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import dcnkit
from test_deform_conv2d import make_inputs, ref, run

HAS_ONEDNN = dcnkit.torch_cpu_gemm().startswith("oneDNN")

# (n, cin, h, w, cout, groups), each with at least 192 output positions (DCNKIT_PACK_MIN_COLUMNS' default: fewer
# keep libtorch's BLAS): cout/groups of 8 (one 16-row block), 48, 70 (64 + a padded block of 6), 65 per group, 256 on
# 20x20 (two tiles: rows split over the tasks), 512 on 7x7 x 4.
SHAPES = [(2, 8, 12, 10, 8, 1), (1, 16, 16, 16, 48, 1), (2, 24, 12, 12, 70, 1), (1, 20, 14, 14, 130, 2),
          (1, 32, 20, 20, 256, 1), (4, 16, 7, 7, 512, 1)]


@pytest.mark.skipif(not HAS_ONEDNN, reason=f"no packed GEMM: {dcnkit.torch_cpu_gemm()}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("modulated", [True, False])
def test_packed_forward_matches_reference(shape, modulated):
    n, cin, h, w, cout, groups = shape
    a = make_inputs(n, cin, h, w, cout, groups=groups, modulated=modulated, dtype=torch.float32, seed=cout)
    before = torch.ops.dcnkit._cpu_gemm_packed_calls()
    y = run(a)
    assert torch.ops.dcnkit._cpu_gemm_packed_calls() == before + 1  # the packed GEMM ran
    r = ref(a)
    np.testing.assert_allclose(y.double().numpy(), r, rtol=1e-5, atol=1e-5 * np.abs(r).max())


def test_few_columns_and_float64_keep_blas():
    before = torch.ops.dcnkit._cpu_gemm_packed_calls()
    for dtype in (torch.float32, torch.float64):
        a = make_inputs(1, 16, 12, 15, 64, dtype=dtype)  # 180 output positions per weight row
        np.testing.assert_allclose(run(a).double().numpy(), ref(a), rtol=1e-5, atol=1e-5 * np.abs(ref(a)).max())
    a = make_inputs(1, 16, 16, 16, 64, dtype=torch.float64)
    np.testing.assert_allclose(run(a).numpy(), ref(a), rtol=1e-10, atol=1e-10 * np.abs(ref(a)).max())
    assert torch.ops.dcnkit._cpu_gemm_packed_calls() == before


def test_cpu_gemm_names_what_runs():
    env = dict(os.environ, DCNKIT_NO_PACKED_GEMM="1")
    out = subprocess.run([sys.executable, "-c", "import dcnkit; print(dcnkit.torch_cpu_gemm())"], env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    assert out == "libtorch BLAS (DCNKIT_NO_PACKED_GEMM is set)"
    env = dict(os.environ, DCNKIT_ONEDNN_LIB="/nonexistent/libdnnl.so.3")
    out = subprocess.run([sys.executable, "-c", "import dcnkit; print(dcnkit.torch_cpu_gemm())"], env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    assert out.startswith("libtorch BLAS (oneDNN was not found") and "/nonexistent/libdnnl.so.3" in out


_CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[3])
from test_deform_conv2d import run
torch.save([run(a) for a in torch.load(sys.argv[1])], sys.argv[2])
"""


@pytest.mark.skipif(not HAS_ONEDNN, reason=f"no packed GEMM: {dcnkit.torch_cpu_gemm()}")
def test_packed_and_blas_paths_agree(tmp_path):
    cases = [make_inputs(s[0], s[1], s[2], s[3], s[4], groups=s[5], dtype=torch.float32, seed=7) for s in SHAPES]
    torch.save(cases, tmp_path / "in.pt")
    env = dict(os.environ, DCNKIT_NO_PACKED_GEMM="1")
    subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "in.pt"), str(tmp_path / "out.pt"),
                    os.path.dirname(__file__)], env=env, check=True, timeout=300)
    for a, blas in zip(cases, torch.load(tmp_path / "out.pt")):
        packed = run(a)
        torch.testing.assert_close(packed, blas, rtol=1e-5, atol=1e-5 * blas.abs().max().item())
