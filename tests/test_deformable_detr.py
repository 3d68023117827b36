"""The Deformable DETR example end to end: every attention of the encoder and decoder one
dcnkit::MultiScaleDeformableAttention node in each exporter's graph, ONNX Runtime's outputs equal to eager
PyTorch's, ``dcnkit compare`` against the NumPy reference runner and ``dcnkit serve`` (one KServe v2 request)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import deformable_detr as ex  # noqa: E402

SIZE = (64, 96)
SMALL = dict(d_model=64, encoder_layers=2, decoder_layers=2, queries=20)  # 8 heads, 4 levels, 4 points


def small_image(seed=0):
    return ex.make_image(96, seed)[:, :, :64, :].copy()


@pytest.fixture(scope="module")
def small():
    model = ex.build(SIZE, **SMALL)
    image = small_image()
    return model, image, ex.eager_outputs(model, image)


def test_level_tables_and_reference_points():
    assert ex.level_sizes(64, 96) == [(8, 12), (4, 6), (2, 3), (1, 2)]
    model = ex.build(SIZE, **SMALL)
    assert model.spatial_shapes.tolist() == [[8, 12], [4, 6], [2, 3], [1, 2]]
    assert model.level_start_index.tolist() == [0, 96, 120, 126]
    ref = model.encoder_reference
    assert ref.shape == (1, 128, 4, 2)
    # Pixel (row 1, col 2) of level 0 (8 x 12) sits at x = 2.5 / 12, y = 1.5 / 8; level 3's last at (0.75, 0.5).
    np.testing.assert_allclose(ref[0, 1 * 12 + 2, 0].numpy(), [2.5 / 12, 1.5 / 8], rtol=1e-6)
    np.testing.assert_allclose(ref[0, 127, 2].numpy(), [0.75, 0.5], rtol=1e-6)
    pos = ex.sine_position(2, 3, 8)
    np.testing.assert_allclose(pos[4, 0].item(), np.sin(1.5 / 2 * 2 * np.pi), atol=1e-6)  # row 1's y angle
    np.testing.assert_allclose(pos[4, 4].item(), np.sin(1.5 / 3 * 2 * np.pi), atol=1e-6)  # col 1's x angle


def test_eager_outputs_depend_on_the_image_and_offsets(small):
    model, image, want = small
    assert want["logits"].shape == (1, 20, 5) and want["boxes"].shape == (1, 20, 4)
    assert np.all((want["boxes"] > 0) & (want["boxes"] < 1))
    other = ex.eager_outputs(model, small_image(3))
    assert np.abs(other["logits"] - want["logits"]).max() > 1e-3
    # The random offset weights make the sampling query-dependent: mmcv's initialisation alone differs.
    plain = ex.eager_outputs(ex.build(SIZE, offset_scale=0.0, **SMALL), image)
    assert np.abs(plain["boxes"] - want["boxes"]).max() > 1e-4
    with pytest.raises(ValueError, match=r"images: expected shape \(N, 3, 64, 96\).*got \(1, 3, 64, 64\)"):
        ex.eager_outputs(model, image[..., :64].copy())


@pytest.mark.parametrize("dynamo", [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")])
def test_export_and_ort_equal_eager(small, dynamo, tmp_path):
    model, image, want = small
    path = ex.export(model, image, tmp_path / "ddetr.onnx", dynamo=dynamo)
    counts = ex.node_counts(path)
    assert counts.get("dcnkit::MultiScaleDeformableAttention", 0) == 2 + 2  # encoder self + decoder cross
    assert not any(k.endswith("::GridSample") for k in counts)
    got = ex.ort_outputs(path, image)
    assert list(got) == ["logits", "boxes"]
    ex.check_outputs(got, want)
    batch = np.concatenate([small_image(5), image])  # the batch is dynamic; each image its own result
    got2 = ex.ort_outputs(path, batch)
    ex.check_outputs(got2, ex.eager_outputs(model, batch))
    np.testing.assert_allclose(got2["logits"][1:], want["logits"], atol=1e-4, rtol=1e-3)
    assert np.abs(got2["logits"][0] - want["logits"][0]).max() > 1e-3


def test_check_outputs_fails_on_a_difference(small):
    want = small[2]
    with pytest.raises(AssertionError, match="boxes"):
        ex.check_outputs(dict(want, boxes=want["boxes"] + np.float32(1e-3)), want)


def test_full_layer_counts_export(tmp_path):
    """The example's configuration (6 + 6 layers, 8 heads, 4 levels, 4 points) at a small width and image."""
    model = ex.build((32, 32), d_model=32, queries=10)
    assert len(model.encoder) == 6 and len(model.decoder) == 6
    attn = model.encoder[0].attn
    assert (attn.num_heads, attn.num_levels, attn.num_points) == (8, 4, 4)
    image = small_image()[:, :, :32, :32].copy()
    path = ex.export(model, image, tmp_path / "full.onnx", dynamo=False)
    assert ex.node_counts(path)["dcnkit::MultiScaleDeformableAttention"] == 12
    ex.check_outputs(ex.ort_outputs(path, image), ex.eager_outputs(model, image))


def test_dcnkit_run_compare_and_serve(small, tmp_path, capsys):
    model, image, want = small
    path = ex.export(model, image, tmp_path / "ddetr.onnx")
    report = ex.cli_checks(path, image, want, tmp_path)
    out = capsys.readouterr().out
    assert "boxes: atol=1e-05, rtol=0.0001; logits: atol=0.0001, rtol=0.001" in out
    rows = {r[0]: r for r in (line.split() for line in out.splitlines()) if r[1:3] == ["reference", "ort-cpu"]}
    assert float(rows["logits"][3]) < 1e-4 and float(rows["boxes"][3]) < 1e-5  # max_abs of ORT vs the reference
    assert report["compare"] == "PASSED" and "--name ddetr" in out
    assert report["serve"]["logits"] <= 1e-3 and report["serve"]["boxes"] <= 1e-4
    with np.load(tmp_path / "outputs.npz") as d:
        assert sorted(d.files) == ["boxes", "logits"]



def test_blank_image_on_every_backend(small, tmp_path):
    """Issue 35: a blank image runs on every backend, equal to eager PyTorch. The detector's outputs are per query
    (logits and boxes of its queries, no threshold in the graph), so no size of them depends on the image: nothing
    empties them."""
    from dcnkit.runtime.registry import make_runner

    model, image, _ = small
    path = ex.export(model, image, tmp_path / "ddetr.onnx")
    blank = np.full_like(image, 0.5)
    want = ex.eager_outputs(model, blank)
    ex.check_outputs(ex.ort_outputs(path, blank), want)
    ex.check_outputs(make_runner(str(path), "reference").run({"images": blank}), want)
    if importlib.util.find_spec("openvino") is not None:  # the [openvino] extra (scripts/setup.sh installs it)
        with make_runner(str(path), "openvino") as runner:
            ex.check_outputs(runner.run({"images": blank}), want)
