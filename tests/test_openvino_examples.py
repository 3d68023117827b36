"""The examples end to end on the openvino backend (small sizes): ResNet-50-DCN, the Faster R-CNN-DCN with the fused
pooler, R-FCN, InternImage and Deformable DETR, each exported as its example does and run through
``make_runner(path, backend="openvino")`` (the backend's default: the per-node DeformConv rule), held against eager
PyTorch with the tolerances the examples use for ONNX Runtime."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "benchmarks"))

pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install dcnkit[openvino])")

from dcnkit.runtime.openvino import openvino_reason  # noqa: E402

pytestmark = pytest.mark.skipif(openvino_reason() is not None, reason=f"openvino backend: {openvino_reason()}")


def ov_run(path, feeds, **options):
    from dcnkit.runtime.registry import make_runner

    with make_runner(path, backend="openvino", **options) as runner:
        return runner.run(feeds)


@pytest.mark.parametrize("deform_conv", ["auto", "openvino"])  # auto: every DeformConv on the kit's kernel
def test_resnet50_dcn(deform_conv, tmp_path_factory):
    import torch

    import bench_resnet50_dcn as r
    from dcnkit.export import to_onnx

    path = tmp_path_factory.getbasetemp() / "resnet50_dcn.onnx"
    model, count = r.resnet50_dcn()
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    if not path.exists():
        to_onnx(model, (x,), str(path), input_names=["x"])
    with torch.no_grad():
        want = model(x).numpy()
    got = ov_run(path, {"x": x.numpy()}, deform_conv=deform_conv)["output"]
    assert count == 9
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_faster_rcnn_dcn_fused_pooler(tmp_path):
    import faster_rcnn_dcn as ex

    model = ex.build(160, seed=0, rpn_top_n=100)
    image = ex.make_image(160, seed=ex.IMAGE_SEED)
    want = ex.eager_detections(model, image)
    path = ex.export(model, image, tmp_path / "frcnn.onnx")
    assert ex.graph_summary(path)["counts"].get("dcnkit::MultiLevelRoIAlign", 0) == 1
    got = ov_run(path, {"images": image})
    assert len(want["scores"]) >= 5
    assert ex.check_detections(got, want, box_atol=0.05, score_atol=5e-4)["detections"] == len(want["scores"])


def test_rfcn(tmp_path):
    import rfcn_dcn as ex

    model = ex.build(128, rpn_top_n=50)
    image = ex.make_image(128, seed=ex.IMAGE_SEED)
    want = ex.eager_detections(model, image)
    path = ex.export(model, image, tmp_path / "rfcn.onnx")
    got = ov_run(path, {"images": image})
    assert len(want["scores"]) >= 5
    assert ex.check_detections(got, want, box_atol=0.05, score_atol=5e-4)["detections"] == len(want["scores"])


def test_internimage(tmp_path):
    import internimage as ex

    model = ex.build(48, channels=32, depths=(2, 2), groups=(2, 4))
    image = np.concatenate([ex.make_image(48, 5), ex.make_image(48, 0)])
    want = ex.eager_outputs(model, image)
    path = ex.export(model, image[:1], tmp_path / "internimage.onnx", outputs=ex.OUTPUTS)
    assert ex.node_counts(path).get("dcnkit::DCNv3", 0) == 4
    ex.check_outputs(ov_run(path, {"images": image}), want, tolerances=ex.TOLERANCES)


def test_deformable_detr(tmp_path):
    import deformable_detr as ex

    model = ex.build((64, 96), d_model=64, encoder_layers=2, decoder_layers=2, queries=20)
    image = ex.make_image(96, 0)[:, :, :64, :].copy()
    want = ex.eager_outputs(model, image)
    path = ex.export(model, image, tmp_path / "ddetr.onnx")
    assert ex.node_counts(path).get("dcnkit::MultiScaleDeformableAttention", 0) == 4
    ex.check_outputs(ov_run(path, {"images": image}), want)
