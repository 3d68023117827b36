"""Every op, forward and backward, captured in a CUDA graph (torch.cuda.graphs), replayed on new inputs and
compared with eager execution: the launchers never synchronise, never copy to the host and allocate only
through the caller (torch's caching allocator), so capture succeeds and replays compute the same values."""
import pytest
import torch

from cuda_op_cases import CASE_NAMES, case, forward_backward

pytestmark = pytest.mark.cuda


def _cuda(tensors, dtype=torch.float32):
    return [t.to("cuda", dtype) for t in tensors]


def _assert_close(actual, expected, what):
    scale = max(1.0, expected.abs().max().item()) if expected.numel() else 1.0
    torch.testing.assert_close(actual, expected, rtol=1e-5, atol=1e-5 * scale, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", CASE_NAMES)
def test_graph_capture_forward_backward_matches_eager(name):
    _, fn, data_a, diff = case(name, seed=0)
    _, _, data_b, _ = case(name, seed=1)  # same shapes, other values (and other RoI batch indices)
    y_b, grads_b, gy_b = forward_backward(fn, _cuda(data_b), diff)

    static = [t.detach().clone().requires_grad_(d) for t, d in zip(_cuda(data_a), diff)]
    static_gy = torch.randn_like(y_b)
    # Warm up on a side stream (as torch.cuda.graphs asks), then capture forward + backward.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            for t in static:
                t.grad = None
            fn(*static).backward(static_gy)
    torch.cuda.current_stream().wait_stream(side)
    for t in static:
        t.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = fn(*static)
        static_y.backward(static_gy)

    with torch.no_grad():
        for s, new in zip(static, _cuda(data_b)):
            s.copy_(new)
        static_gy.copy_(gy_b)
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(static_y, y_b, f"{name}: output")
    for i, (s, g, d) in enumerate(zip(static, grads_b, diff)):
        if d:
            _assert_close(s.grad, g, f"{name}: grad of input {i}")

    # A second replay on the first inputs gives their eager result too.
    y_a, grads_a, _ = forward_backward(fn, _cuda(data_a), diff, grad_output=gy_b)
    with torch.no_grad():
        for s, new in zip(static, _cuda(data_a)):
            s.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    _assert_close(static_y, y_a, f"{name}: output (second replay)")
    for i, (s, g, d) in enumerate(zip(static, grads_a, diff)):
        if d:
            _assert_close(s.grad, g, f"{name}: grad of input {i} (second replay)")
