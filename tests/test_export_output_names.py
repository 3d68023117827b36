"""``to_onnx`` output names for nested outputs (torchvision detectors return ``[{"boxes", "labels", "scores"}]``)
and ``output_axes``: the names map to the right tensors in ONNX Runtime, both exporters."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn

import dcnkit
from dcnkit.export import to_onnx
from dcnkit.runtime import ort_session


class Dets(nn.Module):
    """A detector-like output: boxes (K, 4), labels (K,), scores (K,) with K = N * 3, per image dicts."""

    def __init__(self, images: int = 1):
        super().__init__()
        self.images = images

    def forward(self, x):
        out = []
        for i in range(self.images):
            f = x[i].flatten(1)[:, :12]  # (C, 12)
            out.append({"boxes": f.reshape(-1, 4) * 2.0, "labels": (f.reshape(-1)[:3] > 0).long(),
                        "scores": torch.sigmoid(f.reshape(-1)[3:6])})
        return out


class Pair(nn.Module):
    def forward(self, x):
        return x + 1, x * 2


def _run(path, x):
    sess = ort_session(str(path), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {sess.get_inputs()[0].name: x.numpy()})))


@pytest.mark.parametrize("dynamo", [False, True])
def test_dict_outputs_are_named_by_their_keys(tmp_path, dynamo):
    x = torch.randn(1, 1, 4, 4)
    model = Dets().eval()
    path = to_onnx(model, (x,), tmp_path / "d.onnx", dynamo=dynamo, dynamic_batch=False)
    got = _run(path, x)
    assert list(got) == ["boxes", "labels", "scores"]
    want = model(x)[0]
    for k in got:
        np.testing.assert_allclose(got[k], want[k].numpy(), rtol=1e-6)


def test_several_images_get_indices_and_output_names_override(tmp_path):
    x = torch.randn(2, 1, 4, 4)
    model = Dets(images=2).eval()
    path = to_onnx(model, (x,), tmp_path / "d2.onnx", dynamo=False, dynamic_batch=False)
    got = _run(path, x)
    assert list(got) == ["boxes_0", "labels_0", "scores_0", "boxes_1", "labels_1", "scores_1"]
    np.testing.assert_allclose(got["scores_1"], model(x)[1]["scores"].numpy(), rtol=1e-6)
    names = ["b0", "l0", "s0", "b1", "l1", "s1"]
    path = to_onnx(model, (x,), tmp_path / "d3.onnx", dynamo=False, dynamic_batch=False, output_names=names)
    assert list(_run(path, x)) == names


def test_plain_outputs_keep_their_default_names(tmp_path):
    x = torch.randn(2, 3)
    path = to_onnx(Pair(), (x,), tmp_path / "p.onnx", dynamo=False)
    assert list(_run(path, x)) == ["output_0", "output_1"]


def test_output_axes_name_dims(tmp_path):
    x = torch.randn(1, 1, 4, 4)
    path = to_onnx(Dets().eval(), (x,), tmp_path / "a.onnx", dynamo=False, dynamic_batch=False,
                   output_axes={"boxes": {0: "num_detections"}, "scores": {0: "num_detections"}})
    m = onnx.load(str(path))
    dims = {o.name: [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim] for o in m.graph.output}
    assert dims["boxes"][0] == "num_detections" and dims["boxes"][1] == 4
    assert dims["scores"] == ["num_detections"]


@pytest.mark.parametrize("axes,exc,needle", [
    ({"box": {0: "n"}}, ValueError, "to_onnx: output_axes: expected output names among ['boxes', 'labels', 'scores'], got 'box'"),
    ({"boxes": {-1: "n"}}, TypeError, "to_onnx: output_axes['boxes']: expected a dict {dim (int >= 0): name"),
    ({"boxes": {2: "n"}}, ValueError, "to_onnx: output_axes['boxes']: expected dims below the output's rank 2, got [2]"),
    (["boxes"], TypeError, "to_onnx: output_axes: expected a dict {output name: {dim: name}} or None, got list"),
])
def test_output_axes_errors(tmp_path, axes, exc, needle):
    with pytest.raises(exc) as e:
        to_onnx(Dets().eval(), (torch.randn(1, 1, 4, 4),), tmp_path / "e.onnx", dynamo=False, dynamic_batch=False,
                output_axes=axes)
    assert needle in str(e.value)


def test_non_tensor_output_is_an_error(tmp_path):
    class Bad(nn.Module):
        def forward(self, x):
            return {"a": x, "b": 3}

    with pytest.raises(TypeError, match=r"to_onnx: model: expected a model returning tensors .* got int"):
        to_onnx(Bad(), (torch.randn(2, 2),), tmp_path / "b.onnx", dynamo=False)
    assert dcnkit  # the kit's exporters are registered
