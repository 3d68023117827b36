"""The openvino backend (docs/openvino.md): every operator family exported by default (standard DeformConv / RoiAlign)
and with ``standard_ops=False`` runs through ``make_runner(path, backend="openvino")`` equal to eager PyTorch within
1e-4 relative, with border-heavy offsets and Inf / NaN in the corners of the maps, at two batch sizes of one
compiled model; mmdeploy's and mmcv's names equal the kit's ONNX Runtime library; bad input is named; OpenVINO's
bf16 / f16 hints stay within their stated tolerance; ``dcnkit convert --to openvino`` writes IR that loads anew."""
from __future__ import annotations

import json

import numpy as np
import pytest

from openvino_cases import FAMILIES, case, eager

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install dcnkit[openvino])")

from dcnkit.runtime.openvino import openvino_reason  # noqa: E402

pytestmark = pytest.mark.skipif(openvino_reason() is not None, reason=f"openvino backend: {openvino_reason()}")

RTOL = 1e-4


def assert_close(got, want, what=""):
    """Within 1e-4 relative (NaN where eager has NaN); atol 1e-4 of the output's scale for values near 0."""
    scale = float(np.nanmax(np.abs(np.where(np.isfinite(want), want, 0)))) or 1.0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * scale, equal_nan=True, err_msg=what)


def export(family, path, standard_ops, n=2):
    from dcnkit.export import to_onnx

    module, names, inputs = case(family, n)
    to_onnx(module.eval(), tuple(__import__("torch").from_numpy(a) for a in inputs), str(path),
            standard_ops=standard_ops, input_names=names)
    return module


def op_types(path):
    import onnx

    return {f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in onnx.load(str(path)).graph.node}


@pytest.mark.parametrize("standard_ops", [True, False], ids=["default", "kit-domain"])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_equals_eager_at_two_batch_sizes(family, standard_ops, tmp_path):
    from dcnkit.runtime.registry import make_runner

    path = tmp_path / f"{family}.onnx"
    module = export(family, path, standard_ops)
    if family in ("deform_conv2d", "roi_align", "roi_align_unaligned") and standard_ops:
        assert op_types(path) & {"ai.onnx::DeformConv", "ai.onnx::RoiAlign"}
    else:
        assert any(t.startswith("dcnkit::") for t in op_types(path))
    with make_runner(path, backend="openvino") as runner:
        for n, seed in ((2, 0), (1, 3)):  # one compiled model, dynamic batch (and RoI count)
            _, names, inputs = case(family, n, seed)
            got = runner.run(dict(zip(names, inputs)))
            assert_close(list(got.values())[0], eager(module, inputs), f"{family} batch {n}")


@pytest.mark.parametrize("deform_conv", ["openvino", "kit"])
def test_standard_deform_conv_on_either_kernel(deform_conv, tmp_path):
    from dcnkit.runtime.registry import make_runner

    path = tmp_path / "dcn.onnx"
    module = export("deform_conv2d", path, True)
    _, names, inputs = case("deform_conv2d", 2, 5)
    with make_runner(path, backend="openvino", deform_conv=deform_conv) as runner:
        assert runner.rewritten == (1 if deform_conv == "kit" else 0)
        layers = {op.get_rt_info()["layerType"].astype(str) for op in runner.compiled.get_runtime_model().get_ops()}
        assert ("DeformableConvolution" in layers) == (deform_conv == "openvino"), layers
        assert ("Reference" in layers) == (deform_conv == "kit"), layers  # an extension operation runs as "Reference"
        assert_close(runner.run(dict(zip(names, inputs)))["output"], eager(module, inputs))


def _mm_model(domain, op_type, inputs, n_out=1, **attrs):
    from onnx import TensorProto, helper

    node_inputs, graph_inputs = [], []
    for item in inputs:
        if item is None:
            node_inputs.append("")
            continue
        name, shape, dtype = item if len(item) == 3 else (*item, TensorProto.FLOAT)
        node_inputs.append(name)
        graph_inputs.append(helper.make_tensor_value_info(name, dtype, shape))
    outs = ["y", "count"][:n_out]
    node = helper.make_node(op_type, node_inputs, outs, domain=domain, name="mm", **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
                             ir_version=8)


def _mm_cases():
    from onnx import TensorProto

    rng = np.random.default_rng(1)
    _, _, (x, offset, mask) = case("deform_conv2d", 2)
    w = rng.standard_normal((6, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    _, _, (fx, frois) = case("roi_align", 2)
    _, _, (mrois, f0, f1, f2) = case("multi_level_roi_align", 2)
    _, _, (value, loc, attn) = case("multi_scale_deformable_attn", 2)
    shapes = np.array([[6, 5], [3, 4], [1, 2]], np.int64)
    starts = np.array([0, 30, 42], np.int64)
    _, _, (x3, o3, m3) = case("dcnv3", 2)
    I64 = TensorProto.INT64
    msda_in = [("value", value.shape), ("shapes", [3, 2], I64), ("starts", [3], I64), ("loc", loc.shape),
               ("attn", attn.shape)]
    msda_feeds = dict(value=value, shapes=shapes, starts=starts, loc=loc, attn=attn)
    dcn_attrs = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=2)
    out = []
    for d in ("mmdeploy", "mmcv"):
        out.append((d, "MMCVModulatedDeformConv2d", [("x", x.shape), ("offset", offset.shape), ("mask", mask.shape),
                                                     ("w", w.shape), ("b", b.shape)],
                    dict(x=x, offset=offset, mask=mask, w=w, b=b), dcn_attrs))
        out.append((d, "MMCVDeformConv2d", [("x", x.shape), ("offset", offset.shape), ("w", w.shape)],
                    dict(x=x, offset=offset, w=w), dict(dcn_attrs, padding=[1, 1, 1, 1])))
        out.append((d, "MMCVMultiScaleDeformableAttention", msda_in, msda_feeds, dict(im2col_step=64)))
    out.append(("mmcv", "MMCVRoiAlign", [("x", fx.shape), ("rois", frois.shape)], dict(x=fx, rois=frois),
                dict(output_height=3, output_width=2, spatial_scale=0.5, sampling_ratio=0, mode="max", aligned=1)))
    out.append(("mmcv", "MMCVDeformRoIPool", [("x", fx.shape), ("rois", frois.shape), ("off", (17, 2, 3, 3))],
                dict(x=fx, rois=frois, off=rng.standard_normal((17, 2, 3, 3)).astype(np.float32)),
                dict(pooled_height=3, pooled_width=3, spatial_scale=0.5, sampling_ratio=2.0, gamma=0.1)))
    out.append(("mmdeploy", "MMCVMultiLevelRoiAlign",
                [("rois", mrois.shape), ("f0", f0.shape), ("f1", f1.shape), ("f2", f2.shape)],
                dict(rois=mrois, f0=f0, f1=f1, f2=f2),
                dict(output_height=3, output_width=3, featmap_strides=[4.0, 8.0, 16.0], sampling_ratio=0,
                     finest_scale=8, roi_scale_factor=1.0, aligned=1, pool_mode=0)))
    out.append(("mmdeploy", "TRTDCNv3", [("x", x3.shape), ("o", o3.shape), ("m", m3.shape)], dict(x=x3, o=o3, m=m3),
                dict(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1,
                     group=2, group_channels=4, offset_scale=1.0, im2col_step=64, remove_center=0)))
    out.append(("trt", "MultiscaleDeformableAttnPlugin_TRT", msda_in, msda_feeds, {}))
    return out


@pytest.mark.parametrize("domain, op_type, inputs, feeds, attrs", _mm_cases(),
                         ids=lambda v: v if isinstance(v, str) else "")
def test_mmdeploy_and_mmcv_names_equal_the_ort_library(domain, op_type, inputs, feeds, attrs):
    from dcnkit.runtime import ort_session
    from dcnkit.runtime.registry import make_runner

    model = _mm_model(domain, op_type, inputs, **attrs)
    want = ort_session(model, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    with make_runner(model, backend="openvino") as runner:
        got = runner.run(feeds)["y"]
    assert got.shape == want.shape
    assert_close(got, want, f"{domain}::{op_type}")


def test_psroi_count_output_comes_from_the_kit(tmp_path):
    from dcnkit import reference as R
    from dcnkit.runtime.registry import make_runner

    _, _, (x, rois, trans) = case("deform_psroi_pool", 2)
    model = _mm_model("dcnkit", "DeformPSRoIPool", [("x", x.shape), ("rois", rois.shape), ("t", trans.shape)],
                      n_out=2, spatial_scale=0.5, output_size=3, output_dim=4, group_size=3, part_size=3,
                      sample_per_part=2, trans_std=0.1)
    want, count = R.deform_psroi_pool(x, rois, trans, 0.5, 3, 4, 3, 3, 2, 0.1)
    with make_runner(model, backend="openvino") as runner:
        got = runner.run(dict(x=x, rois=rois, t=trans))
    assert_close(got["y"], want)
    np.testing.assert_array_equal(got["count"], count)


def test_bad_input_names_the_argument(tmp_path):
    from dcnkit.runtime.registry import make_runner

    _, names, (x, rois) = case("roi_align_max", 2)
    path = tmp_path / "ra.onnx"
    export("roi_align_max", path, False)
    with make_runner(path, backend="openvino") as runner:
        rois[3, 0] = 7  # batch index outside [0, 2)
        with pytest.raises(Exception, match=r"RoIAlign.*rois\[3, 0\] \(batch index\): expected a value in \[0, 2\)"):
            runner.run(dict(x=x, rois=rois))
    bad = _mm_model("mmcv", "MMCVRoiAlign", [("x", x.shape), ("rois", rois.shape)], output_height=3, output_width=2,
                    mode="middle")
    with pytest.raises(Exception, match=r"MMCVRoiAlign node 'mm'.*mode"):
        make_runner(bad, backend="openvino")


@pytest.mark.parametrize("precision, rtol", [("bf16", 3e-2), ("f16", 5e-3)])
def test_reduced_precision_hints_within_their_tolerance(precision, rtol, tmp_path):
    """OpenVINO's own layers in bf16 / f16 (where the CPU has them; f32 elsewhere), the kit's in float32 but for the
    DCN GEMM in bf16 with the bf16 hint (tests/test_openvino_bf16.py): a DCN block with a convolution before it stays
    within ``rtol`` of eager float32, relative to the output's scale."""
    import torch

    from dcnkit.export import to_onnx
    from dcnkit.runtime.registry import make_runner

    sys_path = __import__("sys").path
    sys_path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "export"))
    import samples

    torch.manual_seed(0)
    model = samples.DCNv2Block(channels=8).eval()
    x = torch.randn(1, 8, 12, 12)
    path = tmp_path / "block.onnx"
    to_onnx(model, (x,), str(path), standard_ops=False)
    with torch.no_grad():
        want = model(x).numpy()
    with make_runner(path, backend="openvino", inference_precision=precision) as runner:
        got = runner.run({"x": x.numpy()})["output"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < rtol, f"{precision}: {err:.2e} relative to the output's scale"


def test_convert_writes_ir_that_loads_with_its_extension(tmp_path, capsys):
    from dcnkit.cli import main
    from dcnkit.runtime.registry import make_runner

    path = tmp_path / "mlroi.onnx"
    module = export("multi_level_roi_align", path, False)
    out = tmp_path / "ir"
    assert main(["convert", str(path), "--to", "openvino", "-o", str(out)]) == 0
    manifest = json.loads((out / "dcnkit_openvino.json").read_text())
    assert manifest["kit_operations"] == ["MultiLevelRoIAlign"]
    assert (out / "model.xml").is_file() and (out / "libdcnkit_ov.so").is_file()
    assert 'version="dcnkit"' in (out / "model.xml").read_text()
    _, names, inputs = case("multi_level_roi_align", 2, 4)
    with make_runner(out, backend="openvino") as runner:  # the folder: its own copy of the extension
        assert runner.extension.parent == out
        assert_close(list(runner.run(dict(zip(names, inputs))).values())[0], eager(module, inputs))
    assert main(["run", str(out), "--backend", "openvino"]) == 0
    assert main(["convert", str(path), "--to", "openvino", "-o", str(out)]) == 2  # exists: named, not replaced
    assert "-o/--output" in capsys.readouterr().err


def test_cli_lists_runs_and_benches_the_backend(tmp_path, capsys):
    from dcnkit.cli import main

    path = tmp_path / "dcn.onnx"
    export("deform_conv2d", path, True)
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "openvino   available" in out and "libdcnkit_ov.so" in out
    assert main(["run", str(path), "--backend", "openvino", "--device", "CPU"]) == 0
    assert main(["bench", str(path), "--backends", "openvino,ort-cpu", "--iterations", "2", "--warmup", "0"]) == 0
    assert "openvino" in capsys.readouterr().out
    assert main(["compare", str(path), "--backends", "ort-cpu,openvino", "--iterations", "1"]) == 0


def test_serve_answers_on_the_backend(tmp_path):
    import os
    import sys
    import urllib.request

    from server_process import free_port, serving

    path = tmp_path / "dcnv3.onnx"
    module = export("dcnv3", path, False)
    _, names, inputs = case("dcnv3", 1, 2)
    port = free_port()
    cmd = [sys.executable, "-m", "dcnkit", "serve", str(path), "--backend", "openvino", "--device", "CPU",
           "--port", str(port)]
    with serving(cmd, port, env=dict(os.environ), cwd=tmp_path):
        body = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32", "data": a.ravel().tolist()}
                           for n, a in zip(names, inputs)]}
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/dcnv3/infer", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        out = json.loads(urllib.request.urlopen(req, timeout=60).read())["outputs"][0]
        meta = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/dcnv3", timeout=60).read())
    assert meta["platform"] == "openvino"
    want = eager(module, inputs)
    assert_close(np.array(out["data"], np.float32).reshape(out["shape"]), want)


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_empty_constant_in_a_branch_stays_empty(dtype, tmp_path):
    """OpenVINO 2026.4 reads an empty ``Constant`` inside an ``If`` branch as one element (torchvision's batched_nms
    returns one when there is no box: a detector gave a detection of uninitialised memory on a blank image); the
    backend rewrites it to ``ConstantOfShape`` and returns what ONNX Runtime returns, for both branches."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from dcnkit.runtime.openvino_rewrite import rewrite_empty_constants
    from dcnkit.runtime.registry import make_runner

    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))

    def branch(name, value):
        return helper.make_graph([helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(
            value))], name, [], [helper.make_tensor_value_info(name, elem, None)])

    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("empty", np.zeros((0, 4), dtype)),
                            else_branch=branch("full", np.arange(8, dtype=dtype).reshape(2, 4)))
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("y", elem, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    rewritten, count = rewrite_empty_constants(model)
    assert count == 1 and rewritten is not model
    then = next(a.g for a in rewritten.graph.node[0].attribute if a.name == "then_branch")
    assert [n.op_type for n in then.node] == ["Constant", "ConstantOfShape"]
    path = tmp_path / "if.onnx"
    onnx.save(model, str(path))
    for cond, want in ((True, np.zeros((0, 4), dtype)), (False, np.arange(8, dtype=dtype).reshape(2, 4))):
        for backend in ("openvino", "ort-cpu"):
            with make_runner(str(path), backend) as runner:
                got = runner.run({"c": np.array(cond)})["y"]
            assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want), (backend, cond)
