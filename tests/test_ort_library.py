"""The ONNX Runtime custom-op library (domain ``dcnkit``): hand-built ONNX models run in ONNX Runtime and
checked against the NumPy references of docs/operators.md (``dcnkit.reference``) and, for DeformConv2d, against ONNX
Runtime's built-in ``DeformConv``. Also: dynamic batch / RoI count, absent optional inputs, bad models
(errors name the node and the problem), the session helper, and the CUDA execution provider (marked)."""
from __future__ import annotations

import ctypes
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session
from dcnkit.runtime.ort import ort_library

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16


# ------------------------------------------------------------------------------------------------
# Model building
# ------------------------------------------------------------------------------------------------
def make_model(op_type, inputs, outputs=("y",), domain="dcnkit", name="node0", elem=F32, opset=17, **attrs):
    """One-node model. ``inputs``: list of (name, shape) with symbolic dims as str, or None for an
    absent optional input (empty name)."""
    node_inputs, graph_inputs = [], []
    for item in inputs:
        if item is None:
            node_inputs.append("")
            continue
        n, shape = item
        node_inputs.append(n)
        graph_inputs.append(helper.make_tensor_value_info(n, elem, None if shape is None else list(shape)))
    node = helper.make_node(op_type, node_inputs, list(outputs), domain=domain, name=name, **attrs)
    graph = helper.make_graph(
        [node], "g", graph_inputs, [helper.make_tensor_value_info(o, elem, None) for o in outputs]
    )
    imports = [helper.make_opsetid("", opset)]
    if domain:
        imports.append(helper.make_opsetid(domain, 1))
    return helper.make_model(graph, opset_imports=imports, ir_version=10)


def cpu_session(model, threads=2):
    return ort_session(model, providers=["CPUExecutionProvider"], intra_op_num_threads=threads)


def run(model, feeds, threads=2, providers=("CPUExecutionProvider",)):
    sess = ort_session(model, providers=list(providers), intra_op_num_threads=threads)
    return sess.run(None, feeds)


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def random_rois(rng, k, n, h, w, scale=1.0):
    """K RoIs [b, x1, y1, x2, y2] in image coordinates (feature size / scale), some partly outside."""
    x1 = rng.uniform(-2, w / scale, k)
    y1 = rng.uniform(-2, h / scale, k)
    x2 = x1 + rng.uniform(0.5, w / scale, k)
    y2 = y1 + rng.uniform(0.5, h / scale, k)
    b = rng.integers(0, n, k)
    return np.stack([b, x1, y1, x2, y2], axis=1).astype(np.float32)


def assert_close(actual, expected, rtol=1e-5, atol=1e-5):
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


# ------------------------------------------------------------------------------------------------
# The library itself
# ------------------------------------------------------------------------------------------------
def test_library_exports_only_the_entry_points():
    lib = ctypes.CDLL(ort_library())
    fn = lib.dcnkit_op_defs_json
    fn.restype = ctypes.c_char_p
    defs = json.loads(fn().decode())
    assert defs["domain"] == "dcnkit"
    assert [o["onnx_type"] for o in defs["ops"]] == ["DeformConv2d", "RoIAlign", "DeformRoIPool", "DeformPSRoIPool",
                                                     "MultiLevelRoIAlign", "MultiScaleDeformableAttention", "DCNv3",
                                                     "DCNv4", "RoIAlignRotated"]
    assert hasattr(lib, "RegisterCustomOps")
    # Internal symbols stay hidden (version script).
    for hidden in ("_ZN6dcnkit3ort3apiEv", "_ZN6dcnkit3ort13openblas_gemmEPvRKNS_8GemmArgsE"):
        with pytest.raises(AttributeError):
            getattr(lib, hidden)


def test_only_ops_with_a_gemm_get_a_cublas_handle():
    # OpDef::gemm is what the ONNX Runtime CUDA kernels (a cuBLAS handle made at kernel creation, never in Compute
    # unless that failed) and the TensorRT plugins (a context's shared handle) read: only DeformConv2d runs a GEMM;
    # DCNv3, DCNv4, MSDA and the RoI ops get no handle. (The CUDA side itself needs a GPU: compile-checked only.)
    lib = ctypes.CDLL(ort_library())
    fn = lib.dcnkit_op_defs_json
    fn.restype = ctypes.c_char_p
    gemm = {o["onnx_type"]: o["gemm"] for o in json.loads(fn().decode())["ops"]}
    assert gemm == {"DeformConv2d": True, "RoIAlign": False, "DeformRoIPool": False, "DeformPSRoIPool": False,
                    "MultiLevelRoIAlign": False, "MultiScaleDeformableAttention": False, "DCNv3": False,
                    "DCNv4": False, "RoIAlignRotated": False}


# ------------------------------------------------------------------------------------------------
# DeformConv2d
# ------------------------------------------------------------------------------------------------
DCN_CASES = [
    # Cin, Cout, k, stride, padding, dilation, groups, dgroups, bias, mask
    (4, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True),
    (4, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, False, False),
    (4, 4, (3, 2), (2, 1), (0, 1), (1, 2), 2, 2, True, False),
    (6, 4, (1, 3), (1, 2), (2, 0), (2, 1), 2, 3, False, True),
]


def _dcn_feeds(rng, n, cin, cout, k, h, w, stride, padding, dilation, groups, dg, bias, mask, offset_scale=2.0):
    kh, kw = k
    ho = (h + 2 * padding[0] - (dilation[0] * (kh - 1) + 1)) // stride[0] + 1
    wo = (w + 2 * padding[1] - (dilation[1] * (kw - 1) + 1)) // stride[1] + 1
    feeds = {
        "x": rand(rng, n, cin, h, w),
        "offset": rand(rng, n, 2 * dg * kh * kw, ho, wo, scale=offset_scale),
        "weight": rand(rng, cout, cin // groups, kh, kw),
    }
    if bias:
        feeds["bias"] = rand(rng, cout)
    if mask:
        feeds["mask"] = rng.uniform(0, 1, (n, dg * kh * kw, ho, wo)).astype(np.float32)
    return feeds


def _dcn_model(cin, cout, k, stride, padding, dilation, groups, dg, bias, mask, name="dcn"):
    kh, kw = k
    inputs = [
        ("x", ["N", cin, "H", "W"]),
        ("offset", ["N", 2 * dg * kh * kw, "Ho", "Wo"]),
        ("weight", [cout, cin // groups, kh, kw]),
        ("bias", [cout]) if bias else None,
        ("mask", ["N", dg * kh * kw, "Ho", "Wo"]) if mask else None,
    ]
    while inputs and inputs[-1] is None:
        inputs.pop()
    return make_model("DeformConv2d", inputs, name=name, stride=list(stride), padding=list(padding),
                      dilation=list(dilation), groups=groups, deformable_groups=dg)


@pytest.mark.parametrize("case", DCN_CASES)
def test_deform_conv2d_matches_reference(case):
    cin, cout, k, stride, padding, dilation, groups, dg, bias, mask = case
    rng = np.random.default_rng(1)
    model = _dcn_model(cin, cout, k, stride, padding, dilation, groups, dg, bias, mask)
    sess = cpu_session(model)
    for n, h, w in ((1, 7, 9), (3, 6, 5)):  # one session, dynamic batch and size
        feeds = _dcn_feeds(rng, n, cin, cout, k, h, w, stride, padding, dilation, groups, dg, bias, mask)
        (y,) = sess.run(None, feeds)
        expected = ref.deform_conv2d(feeds["x"], feeds["offset"], feeds["weight"], feeds.get("bias"),
                                     stride, padding, dilation, feeds.get("mask"))
        assert y.shape == expected.shape
        assert_close(y, expected)


def test_deform_conv2d_nonfinite_offsets_sample_outside():
    rng = np.random.default_rng(2)
    model = _dcn_model(2, 3, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True)
    feeds = _dcn_feeds(rng, 2, 2, 3, (3, 3), 5, 5, (1, 1), (1, 1), (1, 1), 1, 1, True, True, offset_scale=30.0)
    off = feeds["offset"]
    off[0, 0, 0, 0] = np.nan
    off[0, 3, 1, 2] = np.inf
    off[1, 5, 2, 2] = -np.inf
    (y,) = run(model, feeds)
    expected = ref.deform_conv2d(feeds["x"], off, feeds["weight"], feeds["bias"], (1, 1), (1, 1), (1, 1), feeds["mask"])
    assert np.isfinite(y).all()
    assert_close(y, expected)


def _builtin_deform_conv(cin, cout, k, stride, padding, dilation, groups, dg, bias, mask):
    """ONNX DeformConv (opset 19): X, W, offset, B, mask; pads [h_begin, w_begin, h_end, w_end]."""
    kh, kw = k
    names = ["x", "weight", "offset", "bias" if bias else "", "mask" if mask else ""]
    while names and names[-1] == "":
        names.pop()
    shapes = {"x": ["N", cin, "H", "W"], "weight": [cout, cin // groups, kh, kw],
              "offset": ["N", 2 * dg * kh * kw, "Ho", "Wo"], "bias": [cout], "mask": ["N", dg * kh * kw, "Ho", "Wo"]}
    node = helper.make_node("DeformConv", names, ["y"], strides=list(stride),
                            pads=[padding[0], padding[1], padding[0], padding[1]], dilations=list(dilation),
                            group=groups, offset_group=dg, kernel_shape=[kh, kw])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, F32, shapes[n]) for n in names if n],
                              [helper.make_tensor_value_info("y", F32, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=10)


def _check_against_builtin(case, h, w, seed, tol):
    cin, cout, k, stride, padding, dilation, groups, dg, bias, mask = case
    rng = np.random.default_rng(seed)
    feeds = _dcn_feeds(rng, 2, cin, cout, k, h, w, stride, padding, dilation, groups, dg, bias, mask)
    (ours,) = run(_dcn_model(*case), feeds)
    builtin = ort.InferenceSession(_builtin_deform_conv(*case).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (theirs,) = builtin.run(None, feeds)
    assert_close(ours, theirs, rtol=tol, atol=tol)


@pytest.mark.parametrize("case", DCN_CASES)
def test_deform_conv2d_matches_onnxruntime_builtin_deformconv(case):
    _check_against_builtin(case, 8, 7, seed=3, tol=1e-5)


@pytest.mark.parametrize("case", [
    (16, 8, (3, 3), (1, 1), (1, 1), (1, 1), 2, 2, True, True),   # 48x80 output: several 1024-column tiles
    (96, 32, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, False),  # wide rows: tiles capped by bytes
])
def test_deform_conv2d_large_planes_tile_like_the_builtin(case):
    # Sums of 864 fp32 products in another order than ORT's: 1e-4.
    _check_against_builtin(case, 48, 80, seed=5, tol=1e-4)


def test_deform_conv2d_thread_count_does_not_change_the_result():
    rng = np.random.default_rng(4)
    model = _dcn_model(8, 8, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True)
    feeds = _dcn_feeds(rng, 3, 8, 8, (3, 3), 12, 12, (1, 1), (1, 1), (1, 1), 1, 1, True, True)
    (a,) = run(model, feeds, threads=1)
    (b,) = run(model, feeds, threads=2)
    np.testing.assert_array_equal(a, b)


def _weight_as_initializer(model, feeds):
    """``model`` with its ``weight`` input turned into an initializer of ``feeds["weight"]`` (a constant weight, which
    the library reorders once at session creation), and the feeds without it."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [i for i in out.graph.input if i.name != "weight"]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.append(onnx.numpy_helper.from_array(feeds["weight"], "weight"))
    return out, {k: v for k, v in feeds.items() if k != "weight"}


@pytest.mark.parametrize("case, n, h, w", [
    ((16, 128, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True), 2, 5, 6),     # one tile per thread: rows split
    ((16, 128, (3, 3), (2, 2), (1, 1), (1, 1), 2, 2, True, True), 1, 9, 7),     # the same with 2 conv groups
    ((64, 12, (3, 3), (1, 1), (1, 1), (1, 1), 4, 2, False, True), 1, 48, 48),   # several tiles per thread
])
def test_deform_conv2d_constant_weight_and_small_maps_match_reference(case, n, h, w):
    cin, cout, k, stride, padding, dilation, groups, dg, bias, mask = case
    rng = np.random.default_rng(6)
    feeds = _dcn_feeds(rng, n, cin, cout, k, h, w, stride, padding, dilation, groups, dg, bias, mask)
    model = _dcn_model(cin, cout, k, stride, padding, dilation, groups, dg, bias, mask)
    const_model, const_feeds = _weight_as_initializer(model, feeds)
    expected = ref.deform_conv2d(feeds["x"], feeds["offset"], feeds["weight"], feeds.get("bias"), stride, padding,
                                 dilation, feeds.get("mask"))
    for threads in (1, 2):
        (y,) = run(model, feeds, threads=threads)
        (y_const,) = run(const_model, const_feeds, threads=threads)
        assert_close(y, expected, rtol=1e-4, atol=1e-4)  # fp32 sums of up to 144 products in another order
        # The constant weight is packed once for oneDNN's GEMM (where it is installed), the per-run one multiplied by
        # OpenBLAS: the same products summed in another order.
        assert_close(y_const, expected, rtol=1e-4, atol=1e-4)


def test_deform_conv2d_empty_batch():
    rng = np.random.default_rng(5)
    model = _dcn_model(2, 3, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, False)
    feeds = _dcn_feeds(rng, 0, 2, 3, (3, 3), 5, 5, (1, 1), (1, 1), (1, 1), 1, 1, True, False)
    (y,) = run(model, feeds)
    assert y.shape == (0, 3, 5, 5)


# ------------------------------------------------------------------------------------------------
# RoIAlign
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pool_mode", ["avg", "max"])
@pytest.mark.parametrize("aligned", [0, 1])
@pytest.mark.parametrize("sampling_ratio", [0, 2])
def test_roi_align_matches_reference(pool_mode, aligned, sampling_ratio):
    rng = np.random.default_rng(6)
    model = make_model("RoIAlign", [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])], name="ra",
                       output_size=[3, 2], spatial_scale=0.5, sampling_ratio=sampling_ratio, aligned=aligned,
                       pool_mode=pool_mode)
    sess = cpu_session(model)
    for k in (5, 1, 0):  # dynamic RoI count, none included
        x = rand(rng, 2, 3, 10, 12)
        rois = random_rois(rng, k, 2, 10, 12, scale=0.5)
        (y,) = sess.run(None, {"x": x, "rois": rois})
        expected = ref.roi_align(x, rois, (3, 2), 0.5, sampling_ratio, bool(aligned), pool_mode)
        assert y.shape == (k, 3, 3, 2)
        assert_close(y, expected)


def test_roi_align_defaults_from_op_defs():
    rng = np.random.default_rng(7)
    model = make_model("RoIAlign", [("x", ["N", 2, "H", "W"]), ("rois", ["K", 5])])
    x = rand(rng, 1, 2, 6, 6)
    rois = random_rois(rng, 3, 1, 6, 6)
    (y,) = run(model, {"x": x, "rois": rois})
    # op_defs.h: output_size [1, 1], spatial_scale 1, sampling_ratio 0 (adaptive), not aligned, avg
    assert_close(y, ref.roi_align(x, rois, (1, 1), 1.0, 0, False, "avg"))


# ------------------------------------------------------------------------------------------------
# DeformRoIPool
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_offset", [True, False])
def test_deform_roi_pool_matches_reference(with_offset):
    rng = np.random.default_rng(8)
    inputs = [("x", ["N", 3, "H", "W"]), ("rois", ["K", 5])]
    if with_offset:
        inputs.append(("offset", ["K", 2, 2, 3]))
    model = make_model("DeformRoIPool", inputs, name="drp", output_size=[2, 3], spatial_scale=0.25,
                       sampling_ratio=2, gamma=0.2)
    sess = cpu_session(model)
    for k in (4, 0):
        x = rand(rng, 2, 3, 9, 8)
        rois = random_rois(rng, k, 2, 9, 8, scale=0.25)
        feeds = {"x": x, "rois": rois}
        offset = rand(rng, k, 2, 2, 3, scale=0.5) if with_offset else None
        if with_offset:
            feeds["offset"] = offset
        (y,) = sess.run(None, feeds)
        assert y.shape == (k, 3, 2, 3)
        assert_close(y, ref.deform_roi_pool(x, rois, offset, (2, 3), 0.25, 2, 0.2))


# ------------------------------------------------------------------------------------------------
# DeformPSRoIPool
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("with_trans", [True, False])
@pytest.mark.parametrize("want_count", [True, False])
def test_deform_psroi_pool_matches_reference(with_trans, want_count):
    rng = np.random.default_rng(9)
    P, od, gs, ps, spp, std = 3, 4, 2, 2, 2, 0.1
    C = od * gs * gs
    inputs = [("x", ["N", C, "H", "W"]), ("rois", ["K", 5])]
    if with_trans:
        inputs.append(("trans", ["K", 4, ps, ps]))  # 2 classes
    outputs = ("y", "count") if want_count else ("y",)
    model = make_model("DeformPSRoIPool", inputs, outputs=outputs, name="psroi", spatial_scale=0.5, output_size=P,
                       output_dim=od, group_size=gs, part_size=ps, sample_per_part=spp, trans_std=std,
                       no_trans=0 if with_trans else 1)
    x = rand(rng, 2, C, 10, 11)
    rois = random_rois(rng, 5, 2, 10, 11, scale=0.5)
    feeds = {"x": x, "rois": rois}
    trans = rand(rng, 5, 4, ps, ps) if with_trans else None
    if with_trans:
        feeds["trans"] = trans
    outs = run(model, feeds)
    exp_y, exp_count = ref.deform_psroi_pool(x, rois, trans, 0.5, P, od, gs, ps, spp, std)
    assert len(outs) == len(outputs)
    assert_close(outs[0], exp_y)
    if want_count:
        assert_close(outs[1], exp_count)


# ------------------------------------------------------------------------------------------------
# Bad models and inputs: ONNX Runtime errors naming the node and the problem
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "op_type,inputs,attrs,fragments",
    [
        ("DeformConv2d", [("x", ["N", 2, "H", "W"]), ("o", ["N", 18, "H", "W"]), ("w", [2, 2, 3, 3])],
         {"stride": [0, 1]}, ["stride", "(0, 1)"]),
        ("DeformConv2d", [("x", ["N", 2, "H", "W"]), ("o", ["N", 18, "H", "W"]), ("w", [2, 2, 3, 3])],
         {"padding": [1, 1, 1]}, ["padding", "2 ints", "[1, 1, 1]"]),
        ("DeformConv2d", [("x", ["N", 2, "H", "W"]), ("o", ["N", 18, "H", "W"]), ("w", [2, 2, 3, 3])],
         {"groups": 1.5}, ["groups", "an int", "1.5"]),
        ("RoIAlign", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])], {"pool_mode": "mean"}, ["pool_mode", "mean"]),
        ("RoIAlign", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])], {"output_size": [0, 2]}, ["output_size"]),
        ("DeformRoIPool", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])], {"output_size": [2, -1]}, ["output_size"]),
        ("DeformPSRoIPool", [("x", ["N", 2, "H", "W"]), ("r", ["K", 5])],
         {"group_size": 0, "no_trans": 1}, ["group_size"]),
    ],
)
def test_bad_attributes_fail_at_session_creation(op_type, inputs, attrs, fragments):
    model = make_model(op_type, inputs, name="bad_node", **attrs)
    with pytest.raises(Exception) as info:
        cpu_session(model)
    msg = str(info.value)
    assert "bad_node" in msg
    for f in fragments:
        assert f in msg, msg


def test_wrong_shapes_fail_at_run_naming_node_and_argument():
    rng = np.random.default_rng(10)
    model = _dcn_model(4, 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, 1, True, True, name="my_dcn")
    feeds = _dcn_feeds(rng, 2, 4, 6, (3, 3), 6, 6, (1, 1), (1, 1), (1, 1), 1, 1, True, True)
    sess = cpu_session(model)
    bad = dict(feeds, offset=feeds["offset"][:, :, :4])  # wrong output height
    with pytest.raises(Exception) as info:
        sess.run(None, bad)
    msg = str(info.value)
    assert "my_dcn" in msg and "offset" in msg and "expected" in msg and "got" in msg, msg
    # Inputs without shapes: ONNX Runtime checks nothing, the kernel checks everything.
    loose = make_model("DeformConv2d", [("x", None), ("offset", None), ("weight", None)],
                       name="loose_dcn", padding=[1, 1])
    bad = {"x": feeds["x"][:, :3], "offset": feeds["offset"], "weight": feeds["weight"]}  # 3 channels, weight wants 4
    with pytest.raises(Exception) as info:
        run(loose, bad)
    msg = str(info.value)
    assert "loose_dcn" in msg and "weight" in msg and "expected" in msg, msg
    with pytest.raises(Exception) as info:
        run(loose, {"x": feeds["x"][0], "offset": feeds["offset"], "weight": feeds["weight"]})  # 3-D input
    msg = str(info.value)
    assert "loose_dcn" in msg and "input" in msg and "4-D" in msg, msg
    # The session still works afterwards.
    (y,) = sess.run(None, feeds)
    assert y.shape == (2, 6, 6, 6)


@pytest.mark.parametrize("op_type", ["RoIAlign", "DeformRoIPool", "DeformPSRoIPool"])
@pytest.mark.parametrize("batch_index", [2.0, -1.0, np.nan])
def test_out_of_range_batch_index_is_an_error(op_type, batch_index):
    rng = np.random.default_rng(11)
    attrs = {"output_dim": 4, "no_trans": 1} if op_type == "DeformPSRoIPool" else {}
    model = make_model(op_type, [("x", ["N", 4, "H", "W"]), ("rois", ["K", 5])], name="roi_node", **attrs)
    rois = random_rois(rng, 3, 2, 6, 6)
    rois[1, 0] = batch_index
    with pytest.raises(Exception) as info:
        run(model, {"x": rand(rng, 2, 4, 6, 6), "rois": rois})
    msg = str(info.value)
    assert "roi_node" in msg and "batch" in msg, msg


def test_rois_with_wrong_width_is_an_error():
    rng = np.random.default_rng(12)
    model = make_model("RoIAlign", [("x", ["N", 2, "H", "W"]), ("rois", ["K", "F"])], name="ra_node")
    with pytest.raises(Exception) as info:
        run(model, {"x": rand(rng, 1, 2, 5, 5), "rois": rand(rng, 3, 4)})
    msg = str(info.value)
    assert "ra_node" in msg and "rois" in msg, msg


# ------------------------------------------------------------------------------------------------
# ort_session
# ------------------------------------------------------------------------------------------------
def test_ort_session_accepts_path_bytes_and_modelproto(tmp_path):
    rng = np.random.default_rng(13)
    model = make_model("RoIAlign", [("x", ["N", 2, "H", "W"]), ("rois", ["K", 5])], output_size=[2, 2])
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    feeds = {"x": rand(rng, 1, 2, 6, 6), "rois": random_rois(rng, 2, 1, 6, 6)}
    expected = ref.roi_align(feeds["x"], feeds["rois"], (2, 2))
    for m in (model, model.SerializeToString(), str(path), path):
        sess = ort_session(m, providers=["CPUExecutionProvider"], graph_optimization_level="ORT_ENABLE_ALL")
        assert_close(sess.run(None, feeds)[0], expected)


def test_ort_session_options_are_checked():
    model = make_model("RoIAlign", [("x", ["N", 2, "H", "W"]), ("rois", ["K", 5])])
    sess = ort_session(model, providers=["CPUExecutionProvider"], intra_op_num_threads=1, log_severity_level=3)
    assert sess.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(TypeError, match="intra_op_threads"):
        ort_session(model, intra_op_threads=2)
    with pytest.raises(ValueError, match="graph_optimization_level"):
        ort_session(model, graph_optimization_level="fastest")
    with pytest.raises(FileNotFoundError):
        ort_session("/nonexistent/model.onnx")
    spin = "session.intra_op.allow_spinning"
    sess = ort_session(model, providers=["CPUExecutionProvider"], session_config={spin: "0"})
    assert sess.get_session_options().get_session_config_entry(spin) == "0"
    with pytest.raises(TypeError, match="session_config: expected str keys and values, got .*: 0"):
        ort_session(model, session_config={spin: 0})
    with pytest.raises(TypeError, match="session_config: expected a dict of str to str, got list"):
        ort_session(model, session_config=[spin])


def test_default_providers_fall_back_to_cpu_without_cuda():
    from dcnkit.runtime import ort as ort_mod

    providers = ort_mod.default_providers()
    if not ort_mod.cuda_provider_available():
        assert providers == ["CPUExecutionProvider"]
    else:
        assert providers[0] == "CUDAExecutionProvider"
