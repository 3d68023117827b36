"""ONNX Runtime CUDA execution provider: concurrent Run() calls on one session (8 threads) give the results
of serial runs. Each call's scratch memory (DCN columns, the DeformPSRoIPool count the model does not ask
for) comes from the kernel context's stream-ordered scratch buffer, so the arena cannot hand it to another
run while this run's kernels still use it. Also: a RoI whose batch index is outside [0, N) gives zeros on
CUDA (the kernels never read the host's view of it and never synchronise). Needs onnxruntime-gpu and a GPU."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session
from ort_cuda_skip import ort_cuda_or_skip

pytestmark = pytest.mark.cuda

F32 = TensorProto.FLOAT


def _model(cin=32, cout=8, k=3):
    """x -> DeformConv2d -> y;  y, rois -> DeformPSRoIPool (count not requested) -> z."""
    vi = lambda n, s: helper.make_tensor_value_info(n, F32, s)  # noqa: E731
    dcn = helper.make_node("DeformConv2d", ["x", "offset", "weight", "bias", "mask"], ["y"], domain="dcnkit",
                           name="dcn", stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1,
                           deformable_groups=2)
    ps = helper.make_node("DeformPSRoIPool", ["y", "rois"], ["z"], domain="dcnkit", name="ps",
                          spatial_scale=0.5, output_size=2, output_dim=cout // 4, group_size=2, no_trans=1)
    graph = helper.make_graph(
        [dcn, ps], "g",
        [vi("x", ["N", cin, "H", "W"]), vi("offset", ["N", 2 * 2 * k * k, "H", "W"]),
         vi("weight", [cout, cin, k, k]), vi("bias", [cout]), vi("mask", ["N", 2 * k * k, "H", "W"]),
         vi("rois", ["K", 5])],
        [vi("y", None), vi("z", None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                             ir_version=10)


def _feeds(seed, n=2, cin=32, cout=8, h=48, w=40, k=3):
    rng = np.random.default_rng(seed)
    r = lambda *s, scale=1.0: (rng.standard_normal(s) * scale).astype(np.float32)  # noqa: E731
    x1, y1 = rng.uniform(0, w, 16), rng.uniform(0, h, 16)
    rois = np.stack([rng.integers(0, n, 16), x1, y1, x1 + rng.uniform(4, w, 16), y1 + rng.uniform(4, h, 16)], 1)
    return {"x": r(n, cin, h, w), "offset": r(n, 2 * 2 * k * k, h, w, scale=2.0), "weight": r(cout, cin, k, k, scale=0.1),
            "bias": r(cout), "mask": rng.uniform(0, 1, (n, 2 * k * k, h, w)).astype(np.float32),
            "rois": rois.astype(np.float32)}


def _session():
    sess = ort_session(_model(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers()[0] == "CUDAExecutionProvider"
    return sess


# The scratch memory's source (plugins/onnxruntime/ort_scratch_source.h): ONNX Runtime's choice here (C API >= 18: its
# scratch buffer), and the two paths of C API < 18 forced on this ONNX Runtime: CUDA's memory pool (cudaMallocAsync)
# and, for a device without memory pools, ONNX Runtime's allocator freed after a stream synchronisation.
@pytest.mark.parametrize("scratch", [None, "pool", "allocator"])
def test_concurrent_runs_on_one_cuda_session_equal_serial_runs(scratch, monkeypatch):
    ort_cuda_or_skip()
    if scratch:
        monkeypatch.setenv("DCNKIT_ORT_CUDA_SCRATCH", scratch)
    sess = _session()
    feeds = [_feeds(seed) for seed in range(8)]
    serial = [sess.run(None, f) for f in feeds]
    # The serial results are right (so equality below means correct, not merely repeatable).
    f0 = feeds[0]
    y_ref = ref.deform_conv2d(f0["x"], f0["offset"], f0["weight"], f0["bias"], (1, 1), (1, 1), (1, 1), f0["mask"])
    np.testing.assert_allclose(serial[0][0], y_ref, rtol=1e-4, atol=1e-4)

    results, errors = [[None] * 6 for _ in range(8)], []
    start = threading.Barrier(8)

    def worker(i):
        try:
            start.wait()
            for j in range(6):
                results[i][j] = sess.run(None, feeds[i])
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(f"thread {i}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for i in range(8):
        for j in range(6):
            for out, expected in zip(results[i][j], serial[i]):
                np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5,
                                           err_msg=f"thread {i}, run {j} differs from the serial run")


def test_out_of_range_batch_index_gives_zeros_on_cuda():
    ort_cuda_or_skip()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 8, 9)).astype(np.float32)
    rois = np.array([[0, 1, 1, 6, 5], [5, 1, 1, 6, 5], [np.nan, 0, 0, 3, 3], [1, 0, 2, 7, 7]], np.float32)
    node = helper.make_node("RoIAlign", ["x", "rois"], ["y"], domain="dcnkit", name="ra", output_size=[2, 2],
                            spatial_scale=1.0, sampling_ratio=2, aligned=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F32, ["N", 3, "H", "W"]),
                                            helper.make_tensor_value_info("rois", F32, ["K", 5])],
                              [helper.make_tensor_value_info("y", F32, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                              ir_version=10)
    sess = ort_session(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    (y,) = sess.run(None, {"x": x, "rois": rois})
    assert np.all(y[1] == 0) and np.all(y[2] == 0)
    good = rois[[0, 3]]
    np.testing.assert_allclose(y[[0, 3]], ref.roi_align(x, good, (2, 2), 1.0, 2, True, "avg"), rtol=1e-4, atol=1e-4)
