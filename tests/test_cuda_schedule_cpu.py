"""The CUDA launchers of multi-scale deformable attention and DCNv3 / DCNv4 run on the CPU
(DCNKIT_DCN_CPU_PATH=cuda-schedule, read once per process, so each case runs in a child process): their launch grid
(runs of 8 channels forward, 4 backward, partial runs included), their per-thread functions and their backward
scatter functors (DCNv3's skips zero shares) equal the grid_sample formulations, forward and backward; and a bad
MSDA level table gives what the CUDA kernels give -- zeros, no gradient -- where the CPU path raises."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dcnkit.ops import dcnv3, dcnv4, multi_scale_deformable_attn

from dcnv3_cases import dcnv4_offset_mask, grid_sample_dcnv3
from dcnv3_cases import make_inputs as dcnv3_inputs
from msda_cases import grid_sample_msda, level_tables
from msda_cases import make_inputs as msda_inputs

# group_channels 6 and 11: one partial run forward, a full and a partial one backward (4 + 2; 4 + 4 + 3).
DCNV3_ATTRS = [(3, 3, 1, 1, 1, 1, 1, 1, 2, 6, 1.0), (3, 2, 2, 1, 1, 0, 1, 2, 1, 11, 0.75)]
SIZES = ((4, 5), (3, 3), (1, 2))


def grads(fn, tensors, gy):
    leaves = [t.clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    y.backward(gy)
    return [y.detach()] + [t.grad for t in leaves]


def msda_case(channels, seed):
    value, shapes, starts, loc, attn = msda_inputs(sizes=SIZES, channels=channels, queries=5, seed=seed, spread=0.3)
    g = torch.Generator().manual_seed(seed)  # the child and the parent draw the same
    gy = torch.randn(value.shape[0], loc.shape[1], value.shape[2] * channels, dtype=value.dtype, generator=g)
    gy[..., :4] = 0  # a whole backward run without gradient
    return (value, loc, attn), shapes, starts, gy


def bad_tables():
    shapes, starts = level_tables(SIZES)
    short = shapes.clone()
    short[2, 1] = 1  # sum of H*W is S - 1
    late = starts.clone()
    late[1] = 30  # start + H*W > S
    negative = shapes.clone()
    negative[0] = torch.tensor([-4, -5])  # H*W still 20, the sum still S
    return [(short, starts), (shapes, late), (negative, starts)]


def dcnv3_case(attrs, seed):
    x, offset, mask = dcnv3_inputs(n=2, h=6, w=5, attrs=attrs, seed=seed, offset_std=2.0)
    y = dcnv3(x, offset, mask, *attrs)
    gy = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(seed))
    gy[0] = 0  # zero shares: the point functor skips them
    return (x, offset, mask), gy


def run_all():
    """What the child computes (and the parent, on its own path, for comparison)."""
    out = {"msda": [], "bad": [], "dcnv3": [], "dcnv4": []}
    for channels, seed in ((6, 1), (9, 2)):
        inputs, shapes, starts, gy = msda_case(channels, seed)
        out["msda"].append(grads(lambda v, lo, a: multi_scale_deformable_attn(v, shapes, starts, lo, a), inputs, gy))
        for bad_shapes, bad_starts in bad_tables():
            try:
                out["bad"].append(grads(lambda v, lo, a: multi_scale_deformable_attn(v, bad_shapes, bad_starts, lo, a),
                                        inputs, gy))
            except ValueError as e:
                out["bad"].append(str(e))
    for i, attrs in enumerate(DCNV3_ATTRS):
        inputs, gy = dcnv3_case(attrs, seed=3 + i)
        out["dcnv3"].append(grads(lambda x, o, m: dcnv3(x, o, m, *attrs), inputs, gy))
        x, offset, mask = inputs
        om = dcnv4_offset_mask(offset, mask, attrs[8], mask.shape[-1] // attrs[8])
        out["dcnv4"].append(grads(lambda x, om: dcnv4(x, om, *attrs, 256, 0, softmax=True), (x, om), gy))
    return out


_CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, sys.argv[2])
    from test_cuda_schedule_cpu import run_all
    torch.save(run_all(), sys.argv[1])
""")


@pytest.fixture(scope="module")
def scheduled(tmp_path_factory):
    out = tmp_path_factory.mktemp("cuda_schedule") / "out.pt"
    env = dict(os.environ, DCNKIT_DCN_CPU_PATH="cuda-schedule")
    subprocess.run([sys.executable, "-c", _CHILD, str(out), os.path.dirname(__file__)], env=env, check=True,
                   timeout=300)
    return torch.load(out)


def close(got, want, what):
    for i, (a, b) in enumerate(zip(got, want)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=lambda m: f"{what} [{i}]: {m}")


def test_msda_matches_grid_sample(scheduled):
    for k, (channels, seed) in enumerate(((6, 1), (9, 2))):
        inputs, shapes, starts, gy = msda_case(channels, seed)
        want = grads(lambda v, lo, a: grid_sample_msda(v, shapes, lo, a), inputs, gy)
        close(scheduled["msda"][k], want, f"msda D={channels}")


def test_msda_bad_level_tables_give_zeros_where_the_cpu_raises(scheduled):
    assert len(scheduled["bad"]) == 2 * len(bad_tables())
    for got in scheduled["bad"]:
        assert not isinstance(got, str), got
        for t in got:
            assert t.abs().sum() == 0
    inputs, _, _, _ = msda_case(6, 1)
    for bad_shapes, bad_starts in bad_tables():
        with pytest.raises(ValueError, match=r"multi_scale_deformable_attn: (spatial_shapes|level_start_index)"):
            multi_scale_deformable_attn(inputs[0], bad_shapes, bad_starts, inputs[1], inputs[2])


def test_dcnv3_and_dcnv4_match_grid_sample(scheduled):
    for k, attrs in enumerate(DCNV3_ATTRS):
        inputs, gy = dcnv3_case(attrs, seed=3 + k)
        want = grads(lambda x, o, m: grid_sample_dcnv3(x, o, m, *attrs), inputs, gy)
        close(scheduled["dcnv3"][k], want, f"dcnv3 {attrs}")
        # DCNv4 (softmax, fused offset_mask) against the CPU path, itself checked against the grid_sample formulation
        # in test_dcnv3.py.
        x, offset, mask = inputs
        om = dcnv4_offset_mask(offset, mask, attrs[8], mask.shape[-1] // attrs[8])
        want = grads(lambda x, om: dcnv4(x, om, *attrs, 256, 0, softmax=True), (x, om), gy)
        close(scheduled["dcnv4"][k], want, f"dcnv4 {attrs}")
