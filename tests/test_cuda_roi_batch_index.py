"""A RoI whose batch index is outside [0, N) (or NaN) on CUDA: the launchers give zeros without synchronising;
the torch ops report it as torch reports a bad index, with an asynchronous device-side assert that surfaces
at the next synchronisation. A device-side assert leaves the CUDA context unusable, so each case runs in a
subprocess. (CPU: a ValueError naming the RoI, see test_roi_align.py; ONNX Runtime CUDA: zeros, see
test_ort_cuda_ep.py.)"""
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.cuda

CALLS = {
    "roi_align": "roi_align(x, rois, 2)",
    "deform_roi_pool": "deform_roi_pool(x, rois, None, 2)",
    "deform_psroi_pool": "deform_psroi_pool(x, rois, None, 1.0, 2, 1, 2)",
    "multi_level_roi_align": "multi_level_roi_align([x, x[:, :, ::2, ::2]], rois, 2, [1.0, 2.0], finest_scale=2)",
}


def _run(call, batch_index):
    code = textwrap.dedent(f"""
        import torch
        from dcnkit.ops import deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align
        x = torch.randn(2, 4, 6, 6, device="cuda")
        rois = torch.tensor([[0.0, 0, 0, 3, 3], [{batch_index}, 0, 0, 4, 4]], device="cuda")
        y = {call}
        torch.cuda.synchronize()
        print("finished", float(y[0].abs().sum()) > 0)
    """)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("op", sorted(CALLS))
@pytest.mark.parametrize("batch_index", ["2.0", "-1.0", "float('nan')"])
def test_bad_batch_index_is_an_asynchronous_device_assert(op, batch_index):
    r = _run(CALLS[op], batch_index)
    assert r.returncode != 0 and "finished" not in r.stdout, r.stdout + r.stderr
    assert "device-side assert" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("op", sorted(CALLS))
def test_valid_batch_indices_do_not_assert(op):
    r = _run(CALLS[op], "1.0")
    assert r.returncode == 0 and "finished True" in r.stdout, r.stdout + r.stderr
