"""Backend runners (dcnkit.runtime.runners) and the onnx.reference-based reference runner.

Models are built with onnx.helper (standard DeformConv / RoiAlign and dcnkit-domain nodes) so these tests do
not depend on the exporter; expected values come from dcnkit.reference directly, from ONNX Runtime's own
built-in kernels, or from torchvision.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from dcnkit import reference as ref
from dcnkit.runtime import runners as R
from dcnkit.runtime.reference_runner import ReferenceRunner, reference_evaluator

IR = 10  # onnxruntime 1.31 reads IR <= 13; keep models portable


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 19),)):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets], ir_version=IR)


def _vi(name, shape, t=T.FLOAT):
    return helper.make_tensor_value_info(name, t, shape)


def _init(name, a):
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape, a.ravel().tolist())


def std_deform_conv_model(rng, pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), groups=1, offset_groups=1,
                          cin=4, cout=6, with_mask=True, with_bias=True):
    w = rng.standard_normal((cout, cin // groups, 3, 3)).astype(np.float32)
    b = rng.standard_normal(cout).astype(np.float32)
    ins = ["x", "w", "offset", "b" if with_bias else "", "mask" if with_mask else ""]
    while ins and ins[-1] == "":
        ins.pop()
    node = helper.make_node("DeformConv", ins, ["y"], pads=list(pads), strides=list(strides),
                            dilations=list(dilations), group=groups, offset_group=offset_groups, kernel_shape=[3, 3])
    k = 9 * offset_groups
    vin = [_vi("x", ["N", cin, "H", "W"]), _vi("offset", ["N", 2 * k, "Ho", "Wo"])]
    if with_mask:
        vin.append(_vi("mask", ["N", k, "Ho", "Wo"]))
    inits = [_init("w", w)] + ([_init("b", b)] if with_bias else [])
    return _model([node], vin, [_vi("y", None)], inits), w, (b if with_bias else None)


def dcn_feeds(rng, n, cin, h, w, ho, wo, offset_groups=1, with_mask=True, scale=2.0):
    k = 9 * offset_groups
    f = {
        "x": rng.standard_normal((n, cin, h, w)).astype(np.float32),
        "offset": (scale * rng.standard_normal((n, 2 * k, ho, wo))).astype(np.float32),
    }
    if with_mask:
        f["mask"] = rng.random((n, k, ho, wo)).astype(np.float32)
    return f


# ------------------------------------------------------------------------------------------------
# available_backends / make_runner
# ------------------------------------------------------------------------------------------------
def test_available_backends_lists_every_backend_with_reason_or_none():
    av = R.available_backends()
    assert list(av) == list(R.BACKENDS) == ["ort-cpu", "ort-cuda", "tensorrt", "reference", "openvino"]
    assert av["reference"] is None
    assert av["ort-cpu"] is None, av["ort-cpu"]
    for name, reason in av.items():
        assert reason is None or (isinstance(reason, str) and reason)


def test_unknown_backend_is_a_value_error_naming_argument_and_choices(tmp_path):
    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng)
    with pytest.raises(ValueError) as e:
        R.make_runner(m, backend="onnxruntime")
    msg = str(e.value)
    assert msg.startswith("backend:") and "'onnxruntime'" in msg
    for b in R.BACKENDS:
        assert b in msg


def test_missing_model_file_names_the_argument(tmp_path):
    for backend in ("ort-cpu", "reference"):
        with pytest.raises(FileNotFoundError, match="model: expected an existing ONNX file"):
            R.make_runner(tmp_path / "nope.onnx", backend)


def test_unavailable_backends_raise_with_the_reason():
    av = R.available_backends()
    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng)
    for b in ("ort-cuda", "tensorrt"):
        if av[b] is None:
            continue
        with pytest.raises(R.BackendUnavailable) as e:
            R.make_runner(m, b)
        assert str(e.value).startswith(f"{b}: ") and av[b] in str(e.value)


def test_tensorrt_reason_names_what_is_missing():
    reason = R.available_backends()["tensorrt"]
    try:
        import tensorrt  # noqa: F401
    except ImportError:
        assert "tensorrt" in reason and "not installed" in reason


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["ort-cuda", "tensorrt"])
def test_gpu_backends_match_the_numpy_reference(backend):
    reason = R.available_backends()[backend]
    if reason is not None:
        pytest.skip(reason)
    rng = np.random.default_rng(3)
    m, w, b = std_deform_conv_model(rng)
    with R.make_runner(m, backend) as r:
        for n in (1, 2):  # two shapes: dynamic dims work
            f = dcn_feeds(rng, n, 4, 7, 9, 7, 9)
            want = ref.deform_conv2d(f["x"], f["offset"], w, b, padding=(1, 1), mask=f["mask"])
            np.testing.assert_allclose(r.run(f)["y"], want, rtol=1e-4, atol=1e-4)


def test_runner_metadata_symbolic_dims_and_context_manager(tmp_path):
    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng)
    path = tmp_path / "dc.onnx"
    onnx.save(m, str(path))
    for backend in ("ort-cpu", "reference"):
        with R.make_runner(path, backend) as r:
            assert r.name == backend
            ins = r.inputs()
            assert [i.name for i in ins] == ["x", "offset", "mask"]
            assert ins[0].shape == ("N", 4, "H", "W") and ins[0].dtype == np.float32
            assert not ins[0].is_static
            assert [o.name for o in r.outputs()] == ["y"]


def test_feeds_are_checked_with_messages():
    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng)
    f = dcn_feeds(rng, 1, 4, 6, 6, 6, 6)
    for backend in ("ort-cpu", "reference"):
        r = R.make_runner(m, backend)
        with pytest.raises(ValueError, match=r"feeds: expected inputs .*missing \['mask'\]"):
            r.run({k: v for k, v in f.items() if k != "mask"})
        with pytest.raises(ValueError, match=r"feeds\['x'\]: expected shape \('N', 4, 'H', 'W'\), got \(1, 3, 6, 6\)"):
            r.run({**f, "x": f["x"][:, :3]})
        with pytest.raises(ValueError, match="unknown"):
            r.run({**f, "extra": f["x"]})


# ------------------------------------------------------------------------------------------------
# Values: standard ops
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "pads,strides,dilations,groups,og,with_mask,with_bias",
    [
        ((1, 1, 1, 1), (1, 1), (1, 1), 1, 1, True, True),
        ((0, 1, 2, 1), (2, 1), (1, 2), 2, 2, True, False),
        ((0, 0, 0, 0), (1, 1), (1, 1), 1, 1, False, True),
    ],
)
def test_ort_cpu_and_reference_runner_match_numpy_reference_on_deform_conv(pads, strides, dilations, groups, og,
                                                                           with_mask, with_bias):
    rng = np.random.default_rng(1)
    cin, h, w = 4, 7, 8
    m, wt, b = std_deform_conv_model(rng, pads, strides, dilations, groups, og, cin=cin, with_mask=with_mask,
                                     with_bias=with_bias)
    ho = (h + pads[0] + pads[2] - (dilations[0] * 2 + 1)) // strides[0] + 1
    wo = (w + pads[1] + pads[3] - (dilations[1] * 2 + 1)) // strides[1] + 1
    f = dcn_feeds(rng, 2, cin, h, w, ho, wo, og, with_mask)
    # Independent expectation: the NumPy reference with the padding applied explicitly.
    xp = np.pad(f["x"], ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    want = ref.deform_conv2d(xp, f["offset"], wt, b, stride=strides, padding=(0, 0), dilation=dilations,
                             mask=f.get("mask"))
    got_ort = R.make_runner(m, "ort-cpu").run(f)["y"]
    got_ref = R.make_runner(m, "reference").run(f)["y"]
    assert got_ort.shape == got_ref.shape == want.shape == (2, 6, ho, wo)
    assert got_ref.dtype == np.float32
    np.testing.assert_allclose(got_ref, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got_ort, want, rtol=1e-4, atol=1e-4)


def test_reference_runner_roi_align_matches_torchvision_and_ort():
    torchvision = pytest.importorskip("torchvision")
    import torch

    rng = np.random.default_rng(2)
    for opset, aligned in ((16, True), (10, False)):
        attrs = dict(output_height=3, output_width=4, sampling_ratio=2, spatial_scale=0.5)
        if opset >= 16:
            attrs["coordinate_transformation_mode"] = "half_pixel"
        node = helper.make_node("RoiAlign", ["x", "rois", "bi"], ["y"], **attrs)
        m = _model([node], [_vi("x", [2, 3, 10, 12]), _vi("rois", ["K", 4]), _vi("bi", ["K"], T.INT64)],
                   [_vi("y", None)], opsets=(("", opset),))
        x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
        boxes = np.array([[1.0, 2.0, 15.5, 17.0], [0.0, 0.0, 23.0, 19.0], [5.2, 3.1, 6.0, 4.0]], np.float32)
        bi = np.array([1, 0, 1], np.int64)
        f = {"x": x, "rois": boxes, "bi": bi}
        got = R.make_runner(m, "reference").run(f)["y"]
        rois5 = torch.from_numpy(np.concatenate([bi[:, None].astype(np.float32), boxes], 1))
        want = torchvision.ops.roi_align(torch.from_numpy(x), rois5, (3, 4), 0.5, 2, aligned).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(R.make_runner(m, "ort-cpu").run(f)["y"], want, rtol=1e-4, atol=1e-5)


def test_reference_runner_leaves_standard_nodes_to_onnx_reference():
    rng = np.random.default_rng(4)
    m, wt, b = std_deform_conv_model(rng, (1, 1, 1, 1))
    relu = helper.make_node("Relu", ["y"], ["z"])
    m.graph.node.append(relu)
    m.graph.output[0].CopyFrom(_vi("z", None))
    f = dcn_feeds(rng, 1, 4, 5, 5, 5, 5)
    got = R.make_runner(m, "reference").run(f)["z"]
    want = np.maximum(ref.deform_conv2d(f["x"], f["offset"], wt, b, padding=(1, 1), mask=f["mask"]), 0)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert (got == 0).any()
    np.testing.assert_allclose(R.make_runner(m, "ort-cpu").run(f)["z"], want, rtol=1e-4, atol=1e-4)


def test_reference_runner_rejects_bad_groups_with_a_message():
    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng, offset_groups=1)
    m.graph.input[1].CopyFrom(_vi("offset", ["N", "C", "Ho", "Wo"]))
    m.graph.input[2].CopyFrom(_vi("mask", ["N", "M", "Ho", "Wo"]))
    f = dcn_feeds(rng, 1, 4, 5, 5, 5, 5, offset_groups=2)  # offset has 36 channels, model says 1 group
    with pytest.raises(Exception, match=r"DeformConv: offset: expected 18 channels"):
        R.make_runner(m, "reference").run(f)


def test_reference_runner_options_are_rejected():
    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng)
    with pytest.raises(ValueError, match="options: expected none"):
        ReferenceRunner(m, fp16=True)


# ------------------------------------------------------------------------------------------------
# Values: the kit's own ops (dcnkit domain) in ONNX Runtime vs the reference runner
# ------------------------------------------------------------------------------------------------
def _custom(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, domain="dcnkit", **attrs)


CUSTOM_OPSETS = (("", 17), ("dcnkit", 1))


def _check_custom(m, feeds, want=None, rtol=1e-4, atol=1e-4):
    got_ort = R.make_runner(m, "ort-cpu").run(feeds)
    got_ref = R.make_runner(m, "reference").run(feeds)
    assert got_ort.keys() == got_ref.keys()
    for k in got_ort:
        assert got_ort[k].shape == got_ref[k].shape
        np.testing.assert_allclose(got_ort[k], got_ref[k], rtol=rtol, atol=atol, err_msg=k)
    if want is not None:
        for k, v in want.items():
            np.testing.assert_allclose(got_ref[k], v, rtol=1e-5, atol=1e-5, err_msg=k)
    return got_ref


def test_custom_deform_conv2d_ort_matches_reference_runner():
    rng = np.random.default_rng(5)
    wt = rng.standard_normal((4, 2, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    node = _custom("DeformConv2d", ["x", "offset", "w", "b", "mask"], ["y"], stride=[2, 1], padding=[1, 2],
                   dilation=[1, 2], groups=2, deformable_groups=2)
    m = _model([node], [_vi("x", ["N", 4, 9, 8]), _vi("offset", ["N", 36, 5, 8]), _vi("mask", ["N", 18, 5, 8])],
               [_vi("y", None)], [_init("w", wt), _init("b", b)], CUSTOM_OPSETS)
    f = dcn_feeds(rng, 2, 4, 9, 8, 5, 8, offset_groups=2)
    want = ref.deform_conv2d(f["x"], f["offset"], wt, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), mask=f["mask"])
    _check_custom(m, f, {"y": want})


def test_custom_deform_conv2d_v1_without_bias_and_mask():
    rng = np.random.default_rng(6)
    wt = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    node = _custom("DeformConv2d", ["x", "offset", "w"], ["y"], padding=[1, 1])
    m = _model([node], [_vi("x", [1, 2, 6, 6]), _vi("offset", [1, 18, 6, 6])], [_vi("y", None)],
               [_init("w", wt)], CUSTOM_OPSETS)
    f = dcn_feeds(rng, 1, 2, 6, 6, 6, 6, with_mask=False)
    want = ref.deform_conv2d(f["x"], f["offset"], wt, None, padding=(1, 1))
    _check_custom(m, f, {"y": want})


@pytest.mark.parametrize("pool_mode,aligned", [("avg", 1), ("max", 0)])
def test_custom_roi_align_ort_matches_reference_runner(pool_mode, aligned):
    rng = np.random.default_rng(7)
    node = _custom("RoIAlign", ["x", "rois"], ["y"], output_size=[2, 3], spatial_scale=0.25, sampling_ratio=0,
                   aligned=aligned, pool_mode=pool_mode)
    m = _model([node], [_vi("x", [2, 3, 8, 9]), _vi("rois", ["K", 5])], [_vi("y", None)], opsets=CUSTOM_OPSETS)
    rois = np.array([[0, 1, 2, 20, 25], [1, 0, 0, 35, 31], [1, 10, 10, 11, 12]], np.float32)
    f = {"x": rng.standard_normal((2, 3, 8, 9)).astype(np.float32), "rois": rois}
    want = ref.roi_align(f["x"], rois, (2, 3), 0.25, 0, bool(aligned), pool_mode)
    _check_custom(m, f, {"y": want})


def test_custom_deform_roi_pool_ort_matches_reference_runner():
    rng = np.random.default_rng(8)
    node = _custom("DeformRoIPool", ["x", "rois", "offset"], ["y"], output_size=[3, 3], spatial_scale=0.5,
                   sampling_ratio=2, gamma=0.1)
    m = _model([node], [_vi("x", [1, 2, 10, 10]), _vi("rois", [2, 5]), _vi("offset", [2, 2, 3, 3])],
               [_vi("y", None)], opsets=CUSTOM_OPSETS)
    rois = np.array([[0, 1, 2, 15, 17], [0, 4, 0, 19, 9]], np.float32)
    f = {"x": rng.standard_normal((1, 2, 10, 10)).astype(np.float32), "rois": rois,
         "offset": rng.standard_normal((2, 2, 3, 3)).astype(np.float32)}
    want = ref.deform_roi_pool(f["x"], rois, f["offset"], (3, 3), 0.5, 2, 0.1)
    _check_custom(m, f, {"y": want})


def test_custom_deform_psroi_pool_ort_matches_reference_runner():
    rng = np.random.default_rng(9)
    node = _custom("DeformPSRoIPool", ["x", "rois", "trans"], ["y", "count"], spatial_scale=0.5, output_size=3,
                   output_dim=2, group_size=3, part_size=3, sample_per_part=2, trans_std=0.1, no_trans=0)
    m = _model([node], [_vi("x", [1, 18, 8, 8]), _vi("rois", [2, 5]), _vi("trans", [2, 2, 3, 3])],
               [_vi("y", None), _vi("count", None)], opsets=CUSTOM_OPSETS)
    rois = np.array([[0, 1, 2, 12, 13], [0, 0, 0, 15, 9]], np.float32)
    f = {"x": rng.standard_normal((1, 18, 8, 8)).astype(np.float32), "rois": rois,
         "trans": rng.standard_normal((2, 2, 3, 3)).astype(np.float32)}
    want, count = ref.deform_psroi_pool(f["x"], rois, f["trans"], 0.5, 3, 2, group_size=3, part_size=3,
                                        sample_per_part=2, trans_std=0.1)
    got = _check_custom(m, f, {"y": want, "count": count})
    assert got["count"].max() > 0


def test_reference_evaluator_is_plain_onnx_reference_with_kit_ops():
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(0)
    m, _, _ = std_deform_conv_model(rng)
    ev = reference_evaluator(m)
    assert isinstance(ev, ReferenceEvaluator)
