"""ONNX export of models that use dcnkit's ops and modules emits no warning from dcnkit's own code, with
either exporter (torch.onnx.export dynamo=False / dynamo=True) and in both modes (standard ONNX ops where
they exist, or dcnkit nodes only). The legacy exporter traces: the ops' Python argument checks used to
emit a TracerWarning there. The exported model still computes what torch computes."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import dcnkit  # noqa: E402
import dcnkit.export  # noqa: E402
from dcnkit import nn as dnn  # noqa: E402
from dcnkit import ops  # noqa: E402

from test_roi_align import rand_rois  # noqa: E402

OUR_CODE = Path(dcnkit.__file__).resolve().parent


class EveryModule(torch.nn.Module):
    """Every dcnkit.nn module (torchvision's RoIAlign branch aside) and a functional call of each op."""

    def __init__(self):
        super().__init__()
        self.off = torch.nn.Conv2d(8, 27, 3, padding=1)
        self.v1 = dnn.DeformConv2d(8, 8, 3, padding=1)
        self.v2 = dnn.ModulatedDeformConv2d(8, 8, 3, padding=1)
        self.p1 = dnn.DeformConv2dPack(8, 8, 3, padding=1)
        self.p2 = dnn.ModulatedDeformConv2dPack(8, 8, 3, padding=1, deform_groups=2)
        self.align = dnn.RoIAlign(2, 0.5, 2)
        self.pool = dnn.DeformRoIPool(2, 0.5, 2)
        self.pack = dnn.DeformRoIPoolPack(2, 8, 16, 0.5)
        self.mpack = dnn.ModulatedDeformRoIPoolPack(2, 8, 16, 0.5)
        self.ps = dnn.DeformPSRoIPool(0.5, 2, 2, group_size=2, trans_std=0.1)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "offset" in name or "mask_fc" in name or name.startswith("off."):
                    p.normal_(0, 0.05)

    def forward(self, x, rois):
        o = self.off(x)
        offset, mask = o[:, :18], torch.sigmoid(o[:, 18:])
        f = self.p2(self.p1(self.v2(self.v1(x, offset), offset, mask)))
        g = ops.deform_conv2d(f, offset, self.v1.weight, None, padding=1, mask=mask)
        return (self.align(f, rois), self.pool(f, rois), self.pack(f, rois), self.mpack(f, rois),
                self.ps(g, rois), ops.roi_align(g, rois, (2, 3), 0.5, 2, True, "max"),
                ops.deform_roi_pool(g, rois, None, 2, 0.5, 2), ops.deform_psroi_pool(g, rois, None, 0.5, 2, 2, 2))


@pytest.mark.parametrize("standard", [pytest.param(True, id="standard"), pytest.param(False, id="custom")])
@pytest.mark.parametrize("dynamo", [pytest.param(False, id="legacy"), pytest.param(True, id="dynamo")])
def test_export_emits_no_warning_from_dcnkit(dynamo, standard, tmp_path):
    torch.manual_seed(0)
    model = EveryModule().eval()
    args = (torch.randn(2, 8, 10, 10), rand_rois(3, 2, 20, 20, dtype=torch.float32))
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if standard:
            torch.onnx.export(model, args, str(path), dynamo=dynamo, **({} if dynamo else {"opset_version": 20}))
        else:
            with dcnkit.export.custom_ops_only():
                torch.onnx.export(model, args, str(path), dynamo=dynamo,
                                  **({} if dynamo else {"opset_version": 20}))
    ours = [f"{w.filename}:{w.lineno}: {w.category.__name__}: {w.message}" for w in caught
            if Path(w.filename).resolve().is_relative_to(OUR_CODE)]
    assert ours == []

    # The export is still right (parity in detail: test_export.py).
    from dcnkit.runtime import ort_session

    sess = ort_session(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
    with torch.no_grad():
        expected = model(*args)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g, e.numpy(), rtol=1e-5, atol=1e-5)

