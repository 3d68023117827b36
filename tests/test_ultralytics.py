"""Ultralytics' RT-DETR on the kit's deformable attention (dcnkit.integrations.ultralytics, dcnkit fuse-msda): the
patched attention equals Ultralytics' own in forward and in every parameter gradient; Ultralytics' own ONNX export
of a patched RT-DETR-L (from rtdetr-l.yaml, random weights) writes kit nodes and no GridSample, static and dynamic;
`fuse-msda` fuses the default, dynamic=True and simplify=False exports of the unpatched model; every file gives the
plain export's detections (rows matched: random weights tie scores, so rows are compared in sorted order) in ONNX
Runtime; Ultralytics' own predict runs the fused file (ONNX Runtime, OpenVINO) once `patch()` gave its backends the
kit's libraries; reduced precision keeps the attention float32."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("YOLO_OFFLINE", "1")
os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="dcnkit-yolo-"))  # before ultralytics is imported
ultralytics = pytest.importorskip("ultralytics")
torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

import dcnkit.integrations.ultralytics as dku  # noqa: E402
from dcnkit.runtime import ort_session  # noqa: E402

IMG = 160


def _rows(y: np.ndarray) -> np.ndarray:
    y = y.reshape(-1, y.shape[-1])
    return y[np.lexsort(y.T[::-1])]


def _ops(path) -> list[str]:
    return [n.op_type for n in onnx.load(str(path), load_external_data=False).graph.node]


def _run(path, x, kit: bool):
    import onnxruntime as ort

    sess = ort_session(str(path)) if kit else ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.run(None, {"images": x})[0]


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """RT-DETR-L's Ultralytics exports at 160 px: plain (default, dynamic=True, simplify=False) and patched (default,
    dynamic=True)."""
    from ultralytics import RTDETR

    tmp = tmp_path_factory.mktemp("ultralytics")
    torch.manual_seed(0)
    model = RTDETR("rtdetr-l.yaml")
    state = {k: v.clone() for k, v in model.model.state_dict().items()}
    out = {}
    for name, kw in (("default", {}), ("dynamic", {"dynamic": True}), ("nosimp", {"simplify": False})):
        out[name] = shutil.move(model.export(format="onnx", imgsz=IMG, **kw), tmp / f"{name}.onnx")
    patched = RTDETR("rtdetr-l.yaml")
    patched.model.load_state_dict(state)
    dku.patch(patched)
    for name, kw in (("patched", {}), ("patched-dynamic", {"dynamic": True})):
        out[name] = shutil.move(patched.export(format="onnx", imgsz=IMG, **kw), tmp / f"{name}.onnx")
    dku.unpatch(patched)
    dku.unpatch()
    return {k: Path(v) for k, v in out.items()}


def _msda(d_model=32, heads=4, levels=3, points=2):
    from ultralytics.nn.modules.transformer import MSDeformAttn

    torch.manual_seed(1)
    m = MSDeformAttn(d_model, levels, heads, points).double()
    for p in m.parameters():  # beyond the init's zero offsets and uniform weights
        torch.nn.init.normal_(p, std=0.3)
    return m


def test_patched_attention_equals_ultralytics_in_forward_and_every_parameter_gradient():
    plain = _msda()
    patched = _msda()
    patched.load_state_dict(plain.state_dict())
    dku.patch(patched)
    try:
        assert dku.patched_sites(patched) == [""] and type(patched).__name__ == "MSDeformAttn"
        shapes = [(6, 5), (3, 4), (2, 2)]
        g = torch.Generator().manual_seed(2)
        query = torch.randn(2, 7, 32, generator=g, dtype=torch.float64)
        refer = torch.rand(2, 7, 1, 2, generator=g, dtype=torch.float64) * 1.2 - 0.1  # some points off the maps
        value = torch.randn(2, sum(h * w for h, w in shapes), 32, generator=g, dtype=torch.float64)
        outs = []
        for m in (plain, patched):
            m.zero_grad()
            v = value.clone().requires_grad_()
            y = m(query, refer, v, shapes)
            (y * torch.linspace(-1, 1, y.numel(), dtype=torch.float64).reshape(y.shape)).sum().backward()
            outs.append((y.detach(), v.grad, {n: p.grad.clone() for n, p in m.named_parameters()}))
        (y0, gv0, gp0), (y1, gv1, gp1) = outs
        torch.testing.assert_close(y1, y0, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gv1, gv0, rtol=1e-9, atol=1e-10)
        assert gp0.keys() == gp1.keys() and len(gp0) == 8
        for n in gp0:
            torch.testing.assert_close(gp1[n], gp0[n], rtol=1e-9, atol=1e-10, msg=lambda m: f"{n}: {m}")
    finally:
        dku.unpatch(patched)
        dku.unpatch()
    assert dku.patched_sites(patched) == []


def test_patch_refuses_a_model_without_deformable_attention_and_unknown_releases(monkeypatch):
    from ultralytics.nn.backends.onnx import ONNXBackend

    with pytest.raises(ValueError, match="expected a model with MSDeformAttn modules"):
        dku.patch(torch.nn.Linear(2, 2))
    dku.unpatch()
    loader = ONNXBackend.load_model
    monkeypatch.setattr(ultralytics, "__version__", "8.2.103")
    with pytest.raises(RuntimeError, match=r"ultralytics 8.2.103 is not supported: expected >=8.3,<9.0"):
        dku.patch()
    assert ONNXBackend.load_model is loader  # nothing changed


def test_ultralytics_export_of_a_patched_rtdetr_writes_kit_nodes_and_the_plain_exports_detections(exports):
    x = np.random.default_rng(0).random((1, 3, IMG, IMG), dtype=np.float32)
    want = _rows(_run(exports["default"], x, kit=False))
    for name in ("patched", "patched-dynamic"):
        ops = _ops(exports[name])
        assert ops.count("GridSample") == 0 and ops.count("MultiScaleDeformableAttention") == 6, name
        np.testing.assert_allclose(_rows(_run(exports[name], x, kit=True)), want, atol=1e-4, rtol=1e-4)
    # the dynamic export's level tables follow the input size
    x2 = np.random.default_rng(1).random((1, 3, IMG + 64, IMG + 32), dtype=np.float32)
    np.testing.assert_allclose(_rows(_run(exports["patched-dynamic"], x2, kit=True)),
                               _rows(_run(exports["dynamic"], x2, kit=False)), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["default", "dynamic", "nosimp"])
def test_fuse_msda_fuses_every_export_and_keeps_its_detections(exports, tmp_path, name):
    fused = tmp_path / f"{name}-fused.onnx"
    r = subprocess.run([sys.executable, "-m", "dcnkit", "fuse-msda", str(exports[name]), "-o", str(fused)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    tables = "computed" if name == "dynamic" else "constant"
    assert (f"fused 6 deformable attention(s) into dcnkit::MultiScaleDeformableAttention nodes ({tables} level "
            "tables); 0 GridSample node(s) left") in r.stdout, r.stdout
    ops = _ops(fused)
    assert ops.count("GridSample") == 0 and ops.count("MultiScaleDeformableAttention") == 6
    sizes = [(IMG, IMG)] + ([(IMG + 64, IMG + 32)] if name == "dynamic" else [])
    for h, w in sizes:
        x = np.random.default_rng(h).random((1, 3, h, w), dtype=np.float32)
        np.testing.assert_allclose(_rows(_run(fused, x, kit=True)), _rows(_run(exports[name], x, kit=False)),
                                   atol=1e-4, rtol=1e-4)


def test_fuse_msda_for_tensorrt_names_the_node_it_wrote(exports, tmp_path):
    r = subprocess.run([sys.executable, "-m", "dcnkit", "fuse-msda", str(exports["default"]), "-o",
                        str(tmp_path / "trt.onnx"), "--node", "tensorrt", "--no-verify"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "into trt::MultiscaleDeformableAttnPlugin_TRT nodes" in r.stdout, r.stdout + r.stderr
    assert _ops(tmp_path / "trt.onnx").count("MultiscaleDeformableAttnPlugin_TRT") == 6


def test_ultralytics_predict_runs_the_fused_file_in_onnx_runtime_and_openvino(exports, tmp_path):
    from ultralytics import RTDETR

    img = (np.random.default_rng(0).random((120, 200, 3)) * 255).astype(np.uint8)
    fused = exports["patched"]
    with pytest.raises(Exception, match="MultiScaleDeformableAttention"):  # Ultralytics' own session alone
        RTDETR(str(fused)).predict(img, imgsz=IMG, verbose=False)
    dku.patch()
    try:
        (res,) = RTDETR(str(fused)).predict(img, imgsz=IMG, verbose=False)
        assert res.boxes.data.shape[-1] == 6
        ir = tmp_path / "fused_openvino_model"
        r = subprocess.run([sys.executable, "-m", "dcnkit", "convert", str(fused), "--to", "openvino", "-o", str(ir)],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0 and "openvino" in (r.stdout + r.stderr).lower() and "not installed" in r.stderr:
            pytest.skip("the openvino extra is not installed")
        assert r.returncode == 0, r.stdout + r.stderr
        _write_metadata(fused, ir)
        (res,) = RTDETR(str(ir)).predict(img, imgsz=IMG, verbose=False)
        assert res.boxes.data.shape[-1] == 6
    finally:
        dku.unpatch()


def _write_metadata(onnx_path, folder) -> None:
    """Ultralytics' metadata.yaml beside an OpenVINO IR, from the ONNX export's metadata (what its own OpenVINO
    export writes)."""
    import ast

    import yaml

    meta = {p.key: p.value for p in onnx.load(str(onnx_path), load_external_data=False).metadata_props}
    for k in ("imgsz", "names", "stride", "batch", "args", "kpt_shape", "end2end"):
        if k in meta:
            try:
                meta[k] = ast.literal_eval(meta[k])
            except (ValueError, SyntaxError):
                pass
    (Path(folder) / "metadata.yaml").write_text(yaml.safe_dump(meta))


def test_reduced_precision_keeps_the_attention_and_its_locations_float32(exports):
    from dcnkit.runtime.precision import convert_float_tensors

    model, report = convert_float_tensors(onnx.load(str(exports["patched"])), "float16")
    onnx.checker.check_model(model)
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.input)
             + list(inferred.graph.output)}
    producer = {o: n for n in inferred.graph.node for o in n.output}
    nodes = [n for n in inferred.graph.node if n.op_type == "MultiScaleDeformableAttention"]
    assert len(nodes) == 6
    for n in nodes:
        assert [types.get(n.input[i]) for i in (0, 3, 4)] == [1, 1, 1] and types[n.output[0]] == 1
        for i, last in ((3, "Add"), (4, "Softmax")):  # locations: refer + offsets; weights: softmax, in float32
            t, seen = n.input[i], []
            while producer.get(t) is not None and producer[t].op_type in ("Reshape", "Unsqueeze", "Slice", "Flatten"):
                t = producer[t].input[0]
            assert producer[t].op_type == last and types[t] == 1, (i, producer[t].op_type, types[t])
    assert "deformable attention's locations and weights" in report.summary()
