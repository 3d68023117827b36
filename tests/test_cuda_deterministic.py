"""torch.use_deterministic_algorithms on CUDA: the CUDA backwards of DeformConv2d (a sorted plan and a pixel gather,
deform_conv2d_sorted.h) and of the RoI operators -- RoIAlign, MultiLevelRoIAlign, DeformRoIPool, DeformPSRoIPool (the
tile gather, roi_gather.h) -- then take their atomic-free paths and are bit-identical from run to run; the other CUDA
backwards of the kit (DCNv3 / DCNv4, MSDA) scatter with atomic adds, so under deterministic mode they raise torch's
standard error (never silently differ), warn with warn_only=True, and the forward (no atomics) still runs. On the CPU
the kit's backward is deterministic and runs in that mode."""
import pytest
import torch

from cuda_op_cases import CASE_NAMES, case, forward_backward


@pytest.fixture
def deterministic():
    before, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before, warn_only=warn_only)


@pytest.mark.parametrize("name", CASE_NAMES)
def test_cpu_backward_runs_in_deterministic_mode(deterministic, name):
    _, fn, data, diff = case(name, n=2)
    a = forward_backward(fn, data, diff)
    b = forward_backward(fn, data, diff)
    for ga, gb in zip(a[1], b[1]):
        if ga is not None:
            assert torch.equal(ga, gb)  # bit for bit


_DETERMINISTIC_ON_CUDA = [n for n in CASE_NAMES
                          if n.startswith(("deform_conv2d", "roi_align", "deform_roi_pool", "deform_psroi_pool",
                                           "multi_level_roi_align"))]


@pytest.mark.cuda
@pytest.mark.parametrize("name", _DETERMINISTIC_ON_CUDA)
def test_cuda_backward_with_a_deterministic_path_is_bit_identical_in_deterministic_mode(deterministic, name):
    _, fn, data, diff = case(name, n=2)
    cuda = [t.cuda() for t in data]
    a = forward_backward(fn, cuda, diff)
    b = forward_backward(fn, cuda, diff)
    torch.use_deterministic_algorithms(False)
    c = forward_backward(fn, cuda, diff)  # the atomic path
    for ga, gb, gc in zip(a[1], b[1], c[1]):
        if ga is not None:
            assert torch.equal(ga, gb)  # bit for bit
            torch.testing.assert_close(ga, gc)


@pytest.mark.cuda
@pytest.mark.parametrize("name", [n for n in CASE_NAMES if n not in _DETERMINISTIC_ON_CUDA])
def test_cuda_backward_raises_torch_standard_error_in_deterministic_mode(deterministic, name):
    _, fn, data, diff = case(name, n=2)
    cuda = [t.cuda() for t in data]
    fn(*cuda)  # the forward has no atomics: it runs
    with pytest.raises(RuntimeError, match="does not have a deterministic implementation"):
        forward_backward(fn, cuda, diff)
    torch.use_deterministic_algorithms(True, warn_only=True)
    with pytest.warns(UserWarning, match="does not have a deterministic implementation"):
        forward_backward(fn, cuda, diff)
