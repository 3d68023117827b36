"""roi_align_rotated (mmcv's semantics) against its NumPy reference (docs/operators.md) over the aligned / clockwise /
sampling variants, against roi_align for axis-aligned boxes (an independent check of the geometry), gradients,
opcheck, bounded work, autocast, TorchScript and fx, bad input; export under the kit's domain and mmdeploy's name,
the ONNX Runtime library, the reference runner and shape inference; and the file count of the op table's promise
(issue 38: a new operator is named in at most 10 source files outside tests, docs, benchmarks and examples)."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import dcnkit
from dcnkit import reference as R
from dcnkit.nn import RoIAlignRotated
from dcnkit.ops import roi_align, roi_align_rotated

ROOT = Path(__file__).resolve().parents[1]


def rand_rois(k, n, h, w, dtype=torch.float64, seed=1, scale=1.0, big=False):
    """K rotated RoIs [batch, cx, cy, w, h, angle] around the (h, w) map (some partly outside), angles in
    (-pi, pi)."""
    g = torch.Generator().manual_seed(seed)
    b = torch.randint(0, n, (k, 1), generator=g).to(dtype)
    c = (torch.rand(k, 2, generator=g, dtype=dtype) * 1.2 - 0.1) * torch.tensor([w, h], dtype=dtype)
    size = 0.5 + torch.rand(k, 2, generator=g, dtype=dtype) * torch.tensor([w, h], dtype=dtype) * (2.0 if big else 0.7)
    a = (torch.rand(k, 1, generator=g, dtype=dtype) * 2 - 1) * math.pi
    return torch.cat([b, c / scale, size / scale, a], 1)


def ref(x, rois, out, scale, sr, aligned, clockwise):
    return torch.from_numpy(R.roi_align_rotated(x.double().numpy(), rois.double().numpy(), out, scale, sr, aligned,
                                                clockwise))


# ------------------------------------------------------------------------------------------------
# Values


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("clockwise", [False, True])
@pytest.mark.parametrize("sr", [0, 2, -1])
def test_matches_reference_float64(aligned, clockwise, sr):
    x = torch.randn(2, 3, 9, 11, dtype=torch.float64)
    rois = rand_rois(6, 2, 9, 11, scale=0.7)
    y = roi_align_rotated(x, rois, (3, 2), 0.7, sr, aligned, clockwise)
    assert y.shape == (6, 3, 3, 2)
    torch.testing.assert_close(y, ref(x, rois, (3, 2), 0.7, sr, aligned, clockwise), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("sr", [20, 0])
def test_large_grids_visit_only_samples_on_the_map(sr):
    """Grids over 16 samples per axis take the bounded visit (rows by projection, columns by bisection): the same
    result as the reference's full loop, boxes reaching far outside the map included."""
    x = torch.randn(1, 2, 8, 9, dtype=torch.float64)
    rois = torch.tensor([[0, 4.0, 3.0, 60.0, 45.0, 0.4], [0, -10.0, 20.0, 70.0, 80.0, -2.2],
                         [0, 4.0, 4.0, 3.0, 40.0, math.pi / 2]], dtype=torch.float64)
    for aligned in (True, False):
        y = roi_align_rotated(x, rois, 1, 1.0, sr, aligned)
        torch.testing.assert_close(y, ref(x, rois, 1, 1.0, sr, aligned, False), rtol=1e-12, atol=1e-12)


def test_float32_and_the_module():
    x = torch.randn(2, 4, 12, 10)
    rois = rand_rois(7, 2, 12, 10, dtype=torch.float32)
    m = RoIAlignRotated((4, 3), spatial_scale=1.0, sampling_ratio=0, aligned=True, clockwise=True)
    y = m(x, rois)
    assert y.dtype == torch.float32 and y.shape == (7, 4, 4, 3)
    torch.testing.assert_close(y.double(), ref(x, rois, (4, 3), 1.0, 0, True, True), rtol=1e-5, atol=1e-5)
    assert "clockwise=True" in repr(m)


@pytest.mark.parametrize("sr", [0, 2])
def test_axis_aligned_boxes_are_roi_align(sr):
    """Angle 0: the box [cx, cy, w, h] is RoIAlign's [cx - w/2, cy - h/2, cx + w/2, cy + h/2] (aligned), sample for
    sample: the kit's roi_align and torchvision's agree with it."""
    tv = pytest.importorskip("torchvision")
    x = torch.randn(2, 3, 10, 12, dtype=torch.float64)
    r = rand_rois(5, 2, 10, 12)
    r[:, 5] = 0
    boxes = torch.stack([r[:, 0], r[:, 1] - r[:, 3] / 2, r[:, 2] - r[:, 4] / 2, r[:, 1] + r[:, 3] / 2,
                         r[:, 2] + r[:, 4] / 2], 1)
    y = roi_align_rotated(x, r, (3, 4), 0.5, sr, True)
    torch.testing.assert_close(y, roi_align(x, boxes, (3, 4), 0.5, sr, True), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(y, tv.ops.roi_align(x, boxes, (3, 4), 0.5, sr, True), rtol=1e-10, atol=1e-10)


def test_a_quarter_turn_transposes_the_box():
    """Angle pi/2: the box's y axis runs along -x in image space (mmcv's rotation), so a box of size (w, h) samples
    what the axis-aligned box of size (h, w) samples, its bins turned: y = cy - xx, x = cx + yy."""
    x = torch.randn(1, 2, 11, 11, dtype=torch.float64)
    r = torch.tensor([[0, 5.0, 5.0, 4.0, 6.0, math.pi / 2]], dtype=torch.float64)
    y = roi_align_rotated(x, r, (3, 2), 1.0, 2, True)
    z = roi_align_rotated(x, torch.tensor([[0, 5.0, 5.0, 6.0, 4.0, 0.0]], dtype=torch.float64), (2, 3), 1.0, 2, True)
    torch.testing.assert_close(y[0], z[0].transpose(1, 2).flip(2), rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------------------------------------
# Gradients and registration


@pytest.mark.parametrize("aligned, clockwise, sr", [(True, False, 2), (False, True, 0)])
def test_gradcheck(aligned, clockwise, sr):
    x = torch.randn(2, 2, 6, 7, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(4, 2, 6, 7)
    assert torch.autograd.gradcheck(lambda t: roi_align_rotated(t, rois, (2, 3), 1.0, sr, aligned, clockwise), (x,))


def test_opcheck():
    x = torch.randn(2, 3, 7, 8)
    rois = rand_rois(3, 2, 7, 8, dtype=torch.float32)
    torch.library.opcheck(torch.ops.dcnkit.roi_align_rotated.default, (x, rois, 2, 2, 1.0, 0, True, False))
    torch.library.opcheck(torch.ops.dcnkit.roi_align_rotated.default, (x.requires_grad_(), rois, 2, 3, 0.5, 2, False,
                                                                       True))


@pytest.mark.parametrize("path", ["cuda-schedule", "cuda-schedule-deterministic"])
def test_backward_is_deterministic_and_the_cuda_schedules_agree(path, tmp_path):
    """The CPU backward gives the same bits twice; the CUDA atomic kernel's items (cuda-schedule) and the deterministic
    mode's tile gather (cuda-schedule-deterministic: footprints, boxes, per-pixel sums, in chunks of RoIs) run
    serially on the CPU give the same gradient up to the order of the sums: boxes across the border, both turns,
    adaptive and explicit grids, a negative size with an explicit grid, a box of 1e9 pixels."""
    x = torch.randn(2, 3, 9, 8, dtype=torch.float64, requires_grad=True)
    rois = torch.cat([rand_rois(9, 2, 9, 8, big=True),
                      torch.tensor([[1, 4, 4, -3, -5, 0.4], [0, 4, 4, 1e9, 3, 1.1]], dtype=torch.float64)])
    g = torch.randn(11, 3, 2, 3, dtype=torch.float64)
    args = [((2, 3), 1.0, 0, True, False), ((2, 3), 0.5, 3, False, True)]
    want = []
    for a in args:
        (a1,) = torch.autograd.grad(roi_align_rotated(x, rois, *a), x, g)
        (a2,) = torch.autograd.grad(roi_align_rotated(x, rois, *a), x, g)
        assert torch.equal(a1, a2)
        want.append(a1.numpy())
    np.savez(tmp_path / "in.npz", x=x.detach().numpy(), rois=rois.numpy(), g=g.numpy())
    code = f"""
        import numpy as np, torch
        from dcnkit.ops import roi_align_rotated
        d = np.load({str(tmp_path / 'in.npz')!r})
        x = torch.from_numpy(d["x"]).requires_grad_()
        out = [torch.autograd.grad(roi_align_rotated(x, torch.from_numpy(d["rois"]), *a), x, torch.from_numpy(d["g"]))
               [0].numpy() for a in {args!r}]
        np.save({str(tmp_path / 'out.npy')!r}, np.stack(out))
    """
    env = dict(os.environ, DCNKIT_ROI_CPU_PATH=path)
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), np.stack(want), rtol=1e-12, atol=1e-12)


def test_bounded_work_for_huge_boxes(tmp_path):
    """A box of 1e9 feature pixels (adaptive: ~1e17 samples per bin) returns at once, with the full loop's value of
    the samples that land on the map (a sampling point's weight over the divisor)."""
    code = """
        import math, torch
        from dcnkit.ops import roi_align_rotated
        x = torch.ones(1, 2, 8, 8, dtype=torch.float64)
        rois = torch.tensor([[0, 4.0, 4.0, 1e9, 1e9, 0.3], [0, 4.0, 4.0, 1e9, 3.0, 1.1]], dtype=torch.float64)
        y = roi_align_rotated(x, rois, 2, 1.0, 0)
        rois32 = rois.float()
        y32 = roi_align_rotated(x.float(), rois32, 2, 1.0, 0)
        assert torch.isfinite(y).all() and torch.isfinite(y32).all()
        assert (y >= 0).all() and (y < 1e-6).all(), y
        print("ok")
    """
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "ok" in p.stdout, p.stderr[-2000:]


def test_half_on_the_cpu_and_autocast():
    x = torch.randn(1, 3, 8, 8)
    rois = rand_rois(4, 1, 8, 8, dtype=torch.float32)
    y = roi_align_rotated(x, rois, 2)
    h = roi_align_rotated(x.half(), rois.half(), 2)
    assert h.dtype == torch.float16
    torch.testing.assert_close(h.float(), y, rtol=1e-2, atol=1e-2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = roi_align_rotated(x.bfloat16(), rois, 2)
    assert a.dtype == torch.bfloat16


def test_torchscript_and_fx():
    x = torch.randn(1, 2, 8, 8)
    rois = rand_rois(3, 1, 8, 8, dtype=torch.float32)
    m = RoIAlignRotated(2, 1.0, 2, True, True)
    torch.testing.assert_close(torch.jit.script(m)(x, rois), m(x, rois))
    gm = torch.fx.symbolic_trace(m)
    assert any(n.op == "call_function" and n.target is roi_align_rotated for n in gm.graph.nodes)
    torch.testing.assert_close(gm(x, rois), m(x, rois))


def test_zero_rois_and_bad_input():
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    y = roi_align_rotated(x, torch.zeros(0, 6), 2)
    assert y.shape == (0, 3, 2, 2)
    y.sum().backward()
    assert torch.equal(x.grad, torch.zeros_like(x))
    rois = torch.tensor([[0, 4.0, 4.0, 3.0, 3.0, 0.1]])
    with pytest.raises(ValueError, match=r"roi_align_rotated: rois: expected size 6 at dim 1"):
        roi_align_rotated(x, rois[:, :5], 2)
    with pytest.raises(ValueError, match=r"roi_align_rotated: rois\[0, 0\] \(batch index\): expected a value in "
                                         r"\[0, 2\)"):
        roi_align_rotated(x, torch.tensor([[2, 4.0, 4.0, 3.0, 3.0, 0.1]]), 2)
    with pytest.raises(ValueError, match=r"roi_align_rotated: sampling_ratio: expected a value <= 1024"):
        roi_align_rotated(x, rois, 2, 1.0, 2000)
    with pytest.raises(ValueError, match=r"roi_align_rotated: output_size: expected \(oh, ow\) in \[1, 2\^20\], "
                                         r"got \(0, 2\)"):
        roi_align_rotated(x, rois, (0, 2))
    with pytest.raises(TypeError, match=r"roi_align_rotated: rois: expected dtype Float \(the dtype of input\), "
                                        r"got Double"):
        roi_align_rotated(x, rois.double(), 2)
    with pytest.raises(ValueError, match=r"RoIAlignRotated: sampling_ratio: expected a value <= 1024"):
        RoIAlignRotated(2, sampling_ratio=5000)


# ------------------------------------------------------------------------------------------------
# ONNX: the kit's node, mmdeploy's node, ONNX Runtime, the reference runner, shape inference, precision


class _Pool(torch.nn.Module):
    def forward(self, x, rois):
        return roi_align_rotated(x, rois, (3, 2), 0.5, 2, True, False)


def test_export_runs_in_the_kit_ort_library(tmp_path):
    from dcnkit.runtime import ort_session
    from dcnkit.runtime.reference_runner import ReferenceRunner

    x = torch.randn(2, 3, 10, 12)
    rois = rand_rois(5, 2, 20, 24, dtype=torch.float32)
    path = tmp_path / "rotated.onnx"
    dcnkit.export.to_onnx(_Pool(), (x, rois), path, input_names=["x", "rois"], dynamo=False)
    import onnx

    model = onnx.load(str(path))
    nodes = [n for n in model.graph.node if n.domain == "dcnkit"]
    assert [n.op_type for n in nodes] == ["RoIAlignRotated"]
    feeds = {"x": x.numpy(), "rois": rois.numpy()}
    want = _Pool()(x, rois).numpy()
    got = ort_session(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with ReferenceRunner(str(path)) as r:
        np.testing.assert_allclose(list(r.run(feeds).values())[0], want, rtol=1e-4, atol=1e-4)
    out = dcnkit.export.check_model(path).graph.output[0].type.tensor_type
    dims = [d.dim_param or d.dim_value for d in out.shape.dim]
    assert dims == ["num_rois", 3, 3, 2]


def test_export_runs_on_the_openvino_backend(tmp_path):
    """OpenVINO's ROIAlignRotated-15 has no aligned=0 and no batch-index or work bounds (docs/openvino.md): the node
    runs as the kit's extension operation, at two RoI counts of one compiled model, and so does mmdeploy's."""
    pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install dcnkit[openvino])")
    from dcnkit.runtime.openvino import openvino_reason
    from dcnkit.runtime.registry import make_runner

    if openvino_reason() is not None:
        pytest.skip(f"openvino backend: {openvino_reason()}")
    x = torch.randn(2, 3, 10, 12)
    path = tmp_path / "rotated.onnx"
    dcnkit.export.to_onnx(_Pool(), (x, rand_rois(5, 2, 20, 24, dtype=torch.float32)), path,
                          input_names=["x", "rois"], dynamo=False)
    with make_runner(path, backend="openvino") as runner:
        for k, seed in ((5, 2), (3, 4)):
            rois = rand_rois(k, 2, 20, 24, dtype=torch.float32, seed=seed)
            got = list(runner.run({"x": x.numpy(), "rois": rois.numpy()}).values())[0]
            np.testing.assert_allclose(got, _Pool()(x, rois).numpy(), rtol=1e-5, atol=1e-5)
    # mmdeploy's name with aligned=0, which OpenVINO's own importer refuses: the kit's conversion takes it
    path = tmp_path / "mmdeploy.onnx"
    path.write_bytes(_mmdeploy_model(output_height=3, output_width=2, spatial_scale=0.5, aligned=0,
                                      clockwise=1).SerializeToString())
    x = np.random.default_rng(0).standard_normal((1, 2, 9, 9)).astype(np.float32)
    rois = rand_rois(4, 1, 18, 18, dtype=torch.float32).numpy()
    with make_runner(path, backend="openvino") as runner:
        np.testing.assert_allclose(runner.run({"x": x, "rois": rois})["y"],
                                   R.roi_align_rotated(x, rois, (3, 2), 0.5, 0, False, True), rtol=1e-5, atol=1e-5)


def _mmdeploy_model(domain="mmdeploy", **attrs):
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    node = helper.make_node("MMCVRoIAlignRotated", ["x", "rois"], ["y"], domain=domain, name="rot", **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f, [1, 2, 9, 9]),
                                            helper.make_tensor_value_info("rois", f, ["K", 6])],
                              [helper.make_tensor_value_info("y", f, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)],
                             ir_version=8)


@pytest.mark.parametrize("domain", ["mmdeploy", "mmcv"])
def test_mmdeploy_node_runs_unchanged(domain):
    from dcnkit.runtime import ort_session
    from dcnkit.runtime.reference_runner import ReferenceRunner

    model = _mmdeploy_model(domain, output_height=3, output_width=2, spatial_scale=0.5, sampling_ratio=0, aligned=0,
                            clockwise=1)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 9, 9)).astype(np.float32)
    rois = rand_rois(4, 1, 18, 18, dtype=torch.float32).numpy()
    want = R.roi_align_rotated(x, rois, (3, 2), 0.5, 0, False, True)
    got = ort_session(model, providers=["CPUExecutionProvider"]).run(None, {"x": x, "rois": rois})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with ReferenceRunner(model) as r:
        np.testing.assert_allclose(r.run({"x": x, "rois": rois})["y"], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(Exception, match=r"MMCVRoIAlignRotated: sampling_ratio: expected a value <= 1024.*"
                                        r"\(attribute sampling_ratio\)"):
        ort_session(_mmdeploy_model(domain, sampling_ratio=4096), providers=["CPUExecutionProvider"])


def test_onnx_schema_inference_and_precision_keep_rois_float32():
    import onnx
    from onnx import TensorProto, helper

    from dcnkit.export import register_onnx_schemas
    from dcnkit.runtime.precision import convert_float_tensors

    register_onnx_schemas()
    f = TensorProto.FLOAT
    node = helper.make_node("RoIAlignRotated", ["x", "rois"], ["y"], domain="dcnkit", output_size=[3, 2])
    model = helper.make_model(
        helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f, ["N", 4, "H", "W"]),
                                        helper.make_tensor_value_info("rois", f, ["K", 6])],
                          [helper.make_tensor_value_info("y", f, None)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)])
    out = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0].type.tensor_type
    assert [d.dim_param or d.dim_value for d in out.shape.dim] == ["K", 4, 3, 2]
    from dcnkit.runtime.quantize_shapes import infer  # the quantizer's shape walk reads the same declaration

    assert infer(model).dims["y"] == ["K", 4, 3, 2]
    bad = helper.make_model(
        helper.make_graph([node], "g", [helper.make_tensor_value_info("x", f, [1, 4, 8, 8]),
                                        helper.make_tensor_value_info("rois", f, [3, 5])],
                          [helper.make_tensor_value_info("y", f, None)]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)])
    with pytest.raises(onnx.shape_inference.InferenceError, match=r"RoIAlignRotated: rois: expected size 6 at dim 1"):
        onnx.shape_inference.infer_shapes(bad, strict_mode=True)
    half, _ = convert_float_tensors(model, "float16")
    types = {i.name: i.type.tensor_type.elem_type for i in half.graph.input}
    n = half.graph.node[[k for k, m in enumerate(half.graph.node) if m.op_type == "RoIAlignRotated"][0]]
    assert types["rois"] == f and n.input[1] == "rois"  # the RoIs reach the node in float32
    assert n.input[0] != "x"  # the features through a Cast to float16


# ------------------------------------------------------------------------------------------------
# The op table's promise, and CUDA


def test_the_operator_is_named_in_at_most_ten_source_files():
    """Outside tests, docs, benchmarks, examples, scripts (the fuzz and the kernel report list every op) and markdown,
    the operator appears in its kernel headers, CPU and CUDA files, declaration, Python op and module (and their
    package lists), and its reference: no adapter names it."""
    files = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    import re

    pattern = re.compile(r"roi_?align_?rotated", re.IGNORECASE)
    named = sorted(f for f in files if not re.match(r"^(tests|docs|benchmarks|examples|scripts)/", f) and not f.endswith(".md")
                   and (ROOT / f).is_file() and pattern.search((ROOT / f).read_text(errors="ignore")))
    assert named and len(named) <= 10, named
    adapters = r"^plugins/(torch|onnxruntime|tensorrt|openvino)/|^python/dcnkit/(export|runtime|cli|server)/"
    assert not [f for f in named if re.match(adapters, f)], named


cuda = pytest.mark.skipif(not (torch.cuda.is_available() and dcnkit.cuda_compiled()),
                          reason="needs a CUDA device and dcnkit's CUDA kernels")


@cuda
@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_cuda_matches_cpu_forward_and_backward(dtype):
    x = torch.randn(2, 5, 16, 15, dtype=torch.float64)
    rois = rand_rois(40, 2, 16, 15, big=True)
    g = torch.randn(40, 5, 3, 4, dtype=torch.float64)
    rois = rois.to(dtype).double()  # the reference on the RoIs the device gets (bfloat16 moves a box by ~0.1 px)
    want = roi_align_rotated(x, rois, (3, 4), 1.0, 0, True, True)
    xc = x.to("cuda", dtype).requires_grad_()
    y = roi_align_rotated(xc, rois.to("cuda", dtype), (3, 4), 1.0, 0, True, True)
    tol = 1e-5 if dtype in (torch.float32, torch.float64) else 3e-2
    torch.testing.assert_close(y.double().cpu(), want, rtol=tol, atol=tol)
    xr = x.clone().requires_grad_()
    (gr,) = torch.autograd.grad(roi_align_rotated(xr, rois, (3, 4), 1.0, 0, True, True), xr, g)
    (gc,) = torch.autograd.grad(y, xc, g.to("cuda", dtype))
    torch.testing.assert_close(gc.double().cpu(), gr, rtol=tol * 10, atol=tol * 10)


@cuda
@pytest.mark.cuda
def test_cuda_deterministic_backward_is_bit_identical():
    x = torch.randn(2, 9, 32, 32, device="cuda", requires_grad=True)
    rois = rand_rois(300, 2, 32, 32, dtype=torch.float32, big=True).cuda()
    g = torch.randn(300, 9, 7, 7, device="cuda")
    torch.use_deterministic_algorithms(True)
    try:
        grads = [torch.autograd.grad(roi_align_rotated(x, rois, 7, 1.0, 2), x, g)[0] for _ in range(2)]
    finally:
        torch.use_deterministic_algorithms(False)
    assert torch.equal(grads[0], grads[1])
    (atomic,) = torch.autograd.grad(roi_align_rotated(x, rois, 7, 1.0, 2), x, g)
    torch.testing.assert_close(atomic, grads[0], rtol=1e-4, atol=1e-4)


def _exported(tmp_path):
    x = torch.randn(2, 3, 10, 12)
    path = tmp_path / "rotated.onnx"
    dcnkit.export.to_onnx(_Pool(), (x, rand_rois(5, 2, 20, 24, dtype=torch.float32)), path,
                          input_names=["x", "rois"], dynamo=False)
    return path, x.numpy()


@pytest.mark.cuda
def test_ort_cuda_ep_matches_the_reference(tmp_path):
    from ort_cuda_skip import ort_cuda_or_skip

    ort_cuda_or_skip()
    from dcnkit.runtime import ort_session

    path, x = _exported(tmp_path)
    sess = ort_session(str(path), providers=["CUDAExecutionProvider"])
    for k, seed in ((7, 2), (300, 3)):
        rois = rand_rois(k, 2, 20, 24, dtype=torch.float32, seed=seed, big=True).numpy()
        want = R.roi_align_rotated(x.astype(np.float64), rois.astype(np.float64), (3, 2), 0.5, 2, True, False)
        np.testing.assert_allclose(sess.run(None, {"x": x, "rois": rois})[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.cuda
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_tensorrt_plugin_matches_the_reference(precision, tmp_path):
    from dcnkit.runtime.registry import make_runner
    from dcnkit.runtime.tensorrt_requirements import tensorrt_reason

    if tensorrt_reason() is not None:
        pytest.skip(f"tensorrt backend: {tensorrt_reason()}")
    path, x = _exported(tmp_path)
    tol = 1e-4 if precision == "fp32" else 2e-2
    with make_runner(path, backend="tensorrt", precision=precision) as runner:
        for k, seed in ((7, 2), (300, 3)):
            rois = rand_rois(k, 2, 20, 24, dtype=torch.float32, seed=seed, big=True).numpy()
            want = R.roi_align_rotated(x.astype(np.float64), rois.astype(np.float64), (3, 2), 0.5, 2, True, False)
            got = list(runner.run({"x": x, "rois": rois}).values())[0]
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
