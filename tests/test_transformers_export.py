"""Patched transformers models through ``dcnkit.export.to_onnx`` (one MSDA node per attention layer, no GridSample,
ONNX Runtime with the kit's library equal to eager PyTorch), and ``dcnkit fuse-msda`` on files exported from
transformers' unpatched code (the three call sites, both exporters; other GridSample nodes untouched)."""
from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import hf_models  # noqa: E402

import dcnkit  # noqa: E402
from dcnkit.export.fuse_msda import fuse_msda  # noqa: E402
from dcnkit.integrations import transformers as hf  # noqa: E402
from dcnkit.runtime import ort_session  # noqa: E402
from dcnkit.runtime.detections import as_detections, match_detections  # noqa: E402

OUTPUTS = {"deformable_detr": ("logits", "pred_boxes"), "rt_detr": ("logits", "pred_boxes", "enc_outputs_class"),
           "mask2former": ("class_queries_logits", "masks_queries_logits"),
           "rt_detr_v2": ("logits", "pred_boxes", "enc_outputs_class")}


class Outputs(torch.nn.Module):
    """The model with a tuple of chosen outputs (what an exported detector returns)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, pixel_values):
        out = self.model(pixel_values=pixel_values)
        return tuple(out[k] for k in self.names)


def _counts(path) -> collections.Counter:
    return collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)


# The dynamo exporter on whole models is benchmarks/bench_transformers.py's (about a minute a model here); in the
# tests it exports transformers' three cores (test_fuse_msda_replaces_the_three_call_sites_and_nothing_else) and
# aten._is_all_true (test_dynamo_translates_tensor_checks).
@pytest.mark.parametrize("family, dynamo", [("deformable_detr", False), ("rt_detr", False), ("mask2former", False)])
def test_patched_model_exports_one_msda_node_per_layer_and_runs_in_ort(family, dynamo, tmp_path):
    model, inputs = hf_models.build(family)
    hf.patch(model)
    wrapped = Outputs(model, OUTPUTS[family]).eval()
    with torch.no_grad():
        want = [t.numpy() for t in wrapped(**inputs)]
    path = dcnkit.export.to_onnx(wrapped, (inputs["pixel_values"],), tmp_path / "m.onnx", dynamo=dynamo,
                                 dynamic_batch=False, output_names=list(OUTPUTS[family]))
    counts = _counts(path)
    assert counts["MultiScaleDeformableAttention"] == len(hf.patched_sites(model))
    assert counts["GridSample"] == 0
    got = ort_session(path).run(None, {"pixel_values": inputs["pixel_values"].numpy()})
    if family in ("rt_detr", "rt_detr_v2"):
        # The encoder's class scores (before the top-k) elementwise; the detections by matching (the top-k has
        # exact ties under random weights: ORT and torch keep different members of the tie).
        np.testing.assert_allclose(got[2], want[2], atol=1e-4, rtol=1e-4)
        rep = match_detections(as_detections(want[1], want[0], box_format="cxcywh"),
                               as_detections(got[1], got[0], box_format="cxcywh"), score_atol=1e-4, box_atol=1e-4)
        assert rep.score_failures == 0 and rep.box_failures == 0 and rep.matched > 0, rep.lines()
    else:
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)


class _Sites(torch.nn.Module):
    """transformers' three cores as they are (unpatched), each fed by layout as its models do, plus one plain
    grid_sample that is not deformable attention."""

    def __init__(self):
        super().__init__()
        from transformers.models.deformable_detr.modeling_deformable_detr import MultiScaleDeformableAttention

        self.attn = MultiScaleDeformableAttention()
        self.levels = [(6, 5), (3, 3), (2, 1)]

    def forward(self, value, loc, weights, loc2, weights2, image, grid):
        from transformers.models.d_fine.modeling_d_fine import multi_scale_deformable_attention_v2
        from transformers.models.mask2former.modeling_mask2former import multi_scale_deformable_attention

        shapes = torch.tensor(self.levels)
        starts = torch.tensor([0, 30, 39])
        a = self.attn(value, shapes, self.levels, starts, loc, weights, 64)
        b = multi_scale_deformable_attention(value, self.levels, 1.0 - loc, weights)  # not a copy of a (CSE)
        c = multi_scale_deformable_attention_v2(value, self.levels, loc2, weights2, [3, 1, 2], "default")
        d = torch.nn.functional.grid_sample(image, grid, align_corners=False)
        return a, b, c, d


def _site_inputs():
    g = torch.Generator().manual_seed(0)
    return (torch.randn(1, 41, 2, 4, generator=g), torch.rand(1, 7, 2, 3, 2, 2, generator=g) * 1.2 - 0.1,
            torch.rand(1, 7, 2, 3, 2, generator=g), torch.rand(1, 7, 2, 6, 2, generator=g) * 1.2 - 0.1,
            torch.rand(1, 7, 2, 6, generator=g), torch.randn(1, 3, 5, 5, generator=g),
            torch.rand(1, 4, 4, 2, generator=g) * 2 - 1)


@pytest.mark.parametrize("dynamo, node", [(False, "dcnkit"), (True, "tensorrt")])
def test_fuse_msda_replaces_the_three_call_sites_and_nothing_else(dynamo, node, tmp_path):
    inputs = _site_inputs()
    model = _Sites().eval()
    with torch.no_grad():
        want = [t.numpy() for t in model(*inputs)]
    path = tmp_path / "sites.onnx"
    names = ["value", "loc", "weights", "loc2", "weights2", "image", "grid"]
    torch.onnx.export(model, inputs, str(path), dynamo=dynamo, opset_version=18, input_names=names)
    assert _counts(path)["GridSample"] == 3 * 3 + 1
    fused, report = fuse_msda(onnx.load(str(path)), node=node)
    assert [layout for _, layout, _ in report.fused] == ["v1", "v1", "v2"], report.lines()
    counts = collections.Counter(n.op_type for n in fused.graph.node)
    op = "MultiScaleDeformableAttention" if node == "dcnkit" else "MultiscaleDeformableAttnPlugin_TRT"
    assert counts[op] == 3 and counts["GridSample"] == 1  # the plain one stays
    assert report.grid_samples_left == 1
    out = tmp_path / "fused.onnx"
    onnx.save(fused, str(out))
    got = ort_session(out).run(None, {n: t.numpy() for n, t in zip(names, inputs)})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_fuse_msda_cli_on_a_whole_exported_model(tmp_path):
    """Mask2Former exported from transformers' own code (TorchScript exporter: its grids are float64, which ONNX
    Runtime's GridSample does not take) -> fused, runs with the kit's library, equal to eager PyTorch."""
    model, inputs = hf_models.build("mask2former")
    wrapped = Outputs(model, OUTPUTS["mask2former"]).eval()
    with torch.no_grad():
        want = [t.numpy() for t in wrapped(**inputs)]
    src = tmp_path / "plain.onnx"
    torch.onnx.export(wrapped, (inputs["pixel_values"],), str(src), dynamo=False, opset_version=18,
                      input_names=["pixel_values"])
    dst = tmp_path / "fused.onnx"
    r = subprocess.run([sys.executable, "-m", "dcnkit", "fuse-msda", str(src), "-o", str(dst)], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fused 2 deformable attention(s)" in r.stdout and "0 GridSample node(s) left" in r.stdout
    got = ort_session(dst).run(None, {"pixel_values": inputs["pixel_values"].numpy()})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-4, rtol=1e-4)
    again = subprocess.run([sys.executable, "-m", "dcnkit", "fuse-msda", str(dst), "-o", str(tmp_path / "x.onnx")],
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "nothing fused" in again.stdout
    bad = subprocess.run([sys.executable, "-m", "dcnkit", "fuse-msda", str(src), "-o", str(src)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "-o/--output: expected another file than the input" in bad.stderr


def test_dynamo_translates_tensor_checks(tmp_path):
    """transformers' torch_compilable_check on a tensor (RT-DETR v2, D-FINE, DEIMv2) leaves aten._is_all_true in the
    exported program: the dynamo exporter now translates it (and drops the unused value)."""
    from transformers.utils.import_utils import torch_compilable_check

    class Checked(torch.nn.Module):
        def forward(self, x):
            torch_compilable_check((x.abs() >= 0).all(), "x is NaN")
            return x * 2

    path = dcnkit.export.to_onnx(Checked(), (torch.ones(2, 3),), tmp_path / "c.onnx", dynamo=True)
    got = ort_session(path).run(None, {"x": np.full((2, 3), 1.5, np.float32)})[0]
    np.testing.assert_allclose(got, 3.0)
