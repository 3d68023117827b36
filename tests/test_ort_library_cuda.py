"""The kit's ONNX Runtime library on the CUDA execution provider, against the NumPy references (float32 and
float16 models). Needs onnxruntime-gpu and a GPU; skipped otherwise. Models and feeds: test_ort_library.py."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from dcnkit import reference as ref
from dcnkit.runtime import ort_session
from dcnkit.runtime.ort import ort_library
from test_ort_library import (DCN_CASES, F16, _dcn_feeds, _dcn_model, assert_close, make_model, rand,  # noqa: F401
                              random_rois, run)

def _cuda_or_skip():
    from dcnkit.runtime import ort as ort_mod

    if not ort_mod.cuda_provider_available():
        pytest.skip("onnxruntime has no CUDA execution provider here")
    try:
        ort_library(cuda=True)
    except FileNotFoundError as e:
        pytest.skip(f"libdcnkit_ort_cuda.so not built: {e}")


def _cuda_run(model, feeds):
    sess = ort_session(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.get_providers()[0] == "CUDAExecutionProvider"
    return sess.run(None, feeds)


def _to_f16_model(model):
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for vi in list(m.graph.input) + list(m.graph.output):
        vi.type.tensor_type.elem_type = F16
    return m


@pytest.mark.cuda
@pytest.mark.parametrize("case", DCN_CASES)
def test_cuda_deform_conv2d(case):
    _cuda_or_skip()
    cin, cout, k, stride, padding, dilation, groups, dg, bias, mask = case
    rng = np.random.default_rng(20)
    model = _dcn_model(cin, cout, k, stride, padding, dilation, groups, dg, bias, mask)
    feeds = _dcn_feeds(rng, 2, cin, cout, k, 8, 9, stride, padding, dilation, groups, dg, bias, mask)
    expected = ref.deform_conv2d(feeds["x"], feeds["offset"], feeds["weight"], feeds.get("bias"), stride, padding,
                                 dilation, feeds.get("mask"))
    (y,) = _cuda_run(model, feeds)
    assert_close(y, expected, rtol=1e-4, atol=1e-4)
    (y16,) = _cuda_run(_to_f16_model(model), {k_: v.astype(np.float16) for k_, v in feeds.items()})
    assert y16.dtype == np.float16
    assert_close(y16.astype(np.float32), expected, rtol=2e-2, atol=5e-2)


@pytest.mark.cuda
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
def test_cuda_roi_ops(pool_mode):
    _cuda_or_skip()
    rng = np.random.default_rng(21)
    x = rand(rng, 2, 4, 10, 12)
    rois = random_rois(rng, 6, 2, 10, 12, scale=0.5)
    model = make_model("RoIAlign", [("x", ["N", 4, "H", "W"]), ("rois", ["K", 5])], output_size=[3, 3],
                       spatial_scale=0.5, sampling_ratio=2, aligned=1, pool_mode=pool_mode)
    (y,) = _cuda_run(model, {"x": x, "rois": rois})
    assert_close(y, ref.roi_align(x, rois, (3, 3), 0.5, 2, True, pool_mode), rtol=1e-4, atol=1e-4)
    (y16,) = _cuda_run(_to_f16_model(model), {"x": x.astype(np.float16), "rois": rois.astype(np.float16)})
    assert_close(y16.astype(np.float32),
                 ref.roi_align(x.astype(np.float16), rois.astype(np.float16), (3, 3), 0.5, 2, True, pool_mode),
                 rtol=2e-2, atol=2e-2)
    offset = rand(rng, 6, 2, 3, 3, scale=0.3)
    model = make_model("DeformRoIPool", [("x", ["N", 4, "H", "W"]), ("rois", ["K", 5]), ("offset", ["K", 2, 3, 3])],
                       output_size=[3, 3], spatial_scale=0.5, sampling_ratio=2)
    (y,) = _cuda_run(model, {"x": x, "rois": rois, "offset": offset})
    assert_close(y, ref.deform_roi_pool(x, rois, offset, (3, 3), 0.5, 2, 0.1), rtol=1e-4, atol=1e-4)
    model = make_model("DeformPSRoIPool", [("x", ["N", 4, "H", "W"]), ("rois", ["K", 5])], outputs=("y",),
                       spatial_scale=0.5, output_size=2, output_dim=1, group_size=2, no_trans=1)
    (y,) = _cuda_run(model, {"x": x, "rois": rois})
    assert_close(y, ref.deform_psroi_pool(x, rois, None, 0.5, 2, 1, 2, 2, 4, 0.0)[0], rtol=1e-4, atol=1e-4)


# A bad batch index on the CUDA EP gives zeros (the kernels never synchronise): test_ort_cuda_ep.py.


# ------------------------------------------------------------------------------------------------
# Property tests over shapes and attributes (few examples: see the hypothesis profile in conftest.py)
# ------------------------------------------------------------------------------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(
    n=st.integers(1, 2), groups=st.integers(1, 2), dg=st.integers(1, 2), cpg=st.integers(1, 2),
    cout_pg=st.integers(1, 2), kh=st.integers(1, 3), kw=st.integers(1, 3), sh=st.integers(1, 2),
    sw=st.integers(1, 2), ph=st.integers(0, 2), pw=st.integers(0, 2), dh=st.integers(1, 2), dw=st.integers(1, 2),
    h=st.integers(3, 7), w=st.integers(3, 7), bias=st.booleans(), mask=st.booleans(), seed=st.integers(0, 2**16),
)
def test_deform_conv2d_property(n, groups, dg, cpg, cout_pg, kh, kw, sh, sw, ph, pw, dh, dw, h, w, bias, mask, seed):
    cin = groups * dg * cpg
    cout = groups * cout_pg
    if h + 2 * ph < dh * (kh - 1) + 1 or w + 2 * pw < dw * (kw - 1) + 1:
        return  # no output position
    rng = np.random.default_rng(seed)
    args = (cin, cout, (kh, kw), (sh, sw), (ph, pw), (dh, dw), groups, dg, bias, mask)
    feeds = _dcn_feeds(rng, n, cin, cout, (kh, kw), h, w, (sh, sw), (ph, pw), (dh, dw), groups, dg, bias, mask)
    (y,) = run(_dcn_model(*args), feeds)
    expected = ref.deform_conv2d(feeds["x"], feeds["offset"], feeds["weight"], feeds.get("bias"), (sh, sw),
                                 (ph, pw), (dh, dw), feeds.get("mask"))
    assert_close(y, expected)


@given(
    oh=st.integers(1, 3), ow=st.integers(1, 3), scale=st.sampled_from([0.25, 0.5, 1.0]),
    sampling_ratio=st.integers(0, 3), aligned=st.integers(0, 1), pool_mode=st.sampled_from(["avg", "max"]),
    k=st.integers(0, 4), seed=st.integers(0, 2**16),
)
def test_roi_align_property(oh, ow, scale, sampling_ratio, aligned, pool_mode, k, seed):
    rng = np.random.default_rng(seed)
    x = rand(rng, 2, 2, 7, 6)
    rois = random_rois(rng, k, 2, 7, 6, scale=scale)
    model = make_model("RoIAlign", [("x", ["N", 2, "H", "W"]), ("rois", ["K", 5])], output_size=[oh, ow],
                       spatial_scale=scale, sampling_ratio=sampling_ratio, aligned=aligned, pool_mode=pool_mode)
    (y,) = run(model, {"x": x, "rois": rois})
    assert_close(y, ref.roi_align(x, rois, (oh, ow), scale, sampling_ratio, bool(aligned), pool_mode))
