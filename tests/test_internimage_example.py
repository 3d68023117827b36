"""The InternImage-style example end to end: InternImage's module and parameter names, every DCNv3 layer one
dcnkit::DCNv3 node in each exporter's graph, ONNX Runtime's outputs equal to eager PyTorch's (dynamic batch),
``dcnkit run``, ``dcnkit compare`` against the NumPy reference runner and ``dcnkit serve``."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import internimage as ex  # noqa: E402

SMALL = dict(channels=32, depths=(2, 2), groups=(2, 4))


@pytest.fixture(scope="module")
def small():
    model = ex.build(48, **SMALL)
    image = ex.make_image(48, 0)
    return model, image, ex.eager_outputs(model, image)


def test_module_layout_is_internimages():
    keys = set(ex.build(32, **SMALL).state_dict())
    for k in ("patch_embed.conv1.weight", "patch_embed.norm1.0.running_var", "patch_embed.conv2.bias",
              "patch_embed.norm2.0.weight", "levels.0.blocks.1.norm1.0.weight", "levels.0.blocks.0.dcn.offset.weight",
              "levels.0.blocks.0.dcn.mask.bias", "levels.0.blocks.0.dcn.input_proj.weight",
              "levels.0.blocks.0.dcn.output_proj.weight", "levels.0.blocks.0.dcn.dw_conv.0.weight",
              "levels.0.blocks.0.mlp.fc1.weight", "levels.0.blocks.0.mlp.fc2.bias", "levels.0.norm.0.weight",
              "levels.0.downsample.conv.weight", "levels.0.downsample.norm.1.weight", "levels.1.blocks.1.dcn.mask.weight",
              "conv_head.0.weight", "conv_head.1.0.running_mean", "head.weight"):
        assert k in keys, k
    assert "levels.1.downsample.conv.weight" not in keys


def test_eager_outputs_depend_on_the_image_and_offsets(small):
    model, image, want = small
    assert want["features"].shape == (1, 6, 6, 64) and want["logits"].shape == (1, 10)
    other = ex.eager_outputs(model, ex.make_image(48, 3))
    assert np.abs(other["logits"] - want["logits"]).max() > 1e-4
    # The random offset weights move the sampling off the kernel grid: InternImage's zero initialisation differs.
    plain = ex.eager_outputs(ex.build(48, sampling_scale=0.0, **SMALL), image)
    assert np.abs(plain["features"] - want["features"]).max() > 1e-3
    with pytest.raises(ValueError, match=r"images: expected shape \(N, 3, 48, 48\).*got \(1, 3, 48, 32\)"):
        ex.eager_outputs(model, image[..., :32].copy())


@pytest.mark.parametrize("dynamo", [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")])
def test_export_and_ort_equal_eager(small, dynamo, tmp_path):
    model, image, want = small
    path = ex.export(model, image, tmp_path / "internimage.onnx", dynamo=dynamo, outputs=ex.OUTPUTS)
    counts = ex.node_counts(path)
    assert counts.get("dcnkit::DCNv3", 0) == 4
    assert not any(k.endswith("::GridSample") for k in counts)
    got = ex.ort_outputs(path, image)
    assert list(got) == ["features", "logits"]
    ex.check_outputs(got, want, tolerances=ex.TOLERANCES)
    batch = np.concatenate([ex.make_image(48, 5), image])  # the batch is dynamic; each image its own result
    got2 = ex.ort_outputs(path, batch)
    ex.check_outputs(got2, ex.eager_outputs(model, batch), tolerances=ex.TOLERANCES)
    np.testing.assert_allclose(got2["logits"][1:], want["logits"], atol=1e-4, rtol=1e-3)


def test_dcnkit_run_compare_and_serve(small, tmp_path, capsys):
    model, image, want = small
    path = ex.export(model, image, tmp_path / "internimage.onnx", outputs=ex.OUTPUTS)
    report = ex.cli_checks(path, image, want, tmp_path, tolerances=ex.TOLERANCES, name="internimage")
    out = capsys.readouterr().out
    rows = {r[0]: r for r in (line.split() for line in out.splitlines()) if r[1:3] == ["reference", "ort-cpu"]}
    assert float(rows["features"][3]) < 1e-4 and float(rows["logits"][3]) < 1e-4  # max_abs, ORT vs the reference
    assert report["compare"] == "PASSED" and "--name internimage" in out
    assert report["serve"]["features"] <= 1e-3 and report["serve"]["logits"] <= 1e-3
