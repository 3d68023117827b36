"""scripts/check_tensorrt.py, the check to run first where TensorRT exists: its cases checked on ONNX Runtime here,
its TensorRT tool checks (scripts/tensorrt_tool_checks.py) parsed, skipped cleanly without TensorRT, and their
inputs checked on the CPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dcnkit.runtime import runners

ROOT = Path(__file__).resolve().parents[1]
TRT_REASON = runners.available_backends()["tensorrt"]
no_tensorrt = pytest.mark.skipif(TRT_REASON is None, reason="TensorRT can run here: the 'missing' paths do not apply")


# ------------------------------------------------------------------------------------------------
# The GPU check script: its cases checked on ONNX Runtime here; TensorRT skipped with the reason
# ------------------------------------------------------------------------------------------------
def test_gpu_check_script_cases_are_right_on_the_cpu():
    script = ROOT / "scripts" / "check_tensorrt.py"
    p = subprocess.run([sys.executable, str(script), "--backend", "ort-cpu", "--precisions", "fp32",
                        "--iterations", "1"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    rows = [line for line in p.stdout.splitlines() if line.endswith("  ok")]
    names = [r.split("  ")[0].strip() for r in rows]
    assert names == ["DeformConv2d", "MMCVModulatedDeformConv2d", "RoIAlign avg", "RoIAlign max", "MMCVRoiAlign max",
                     "DeformRoIPool", "DeformPSRoIPool", "DeformPSRoIPool R-FCN offsets", "DeformPSRoIPool R-FCN scores",
                     "DeformPSRoIPool R-FCN boxes", "MultiLevelRoIAlign", "MMCVMultiLevelRoiAlign",
                     "MultiScaleDeformableAttention", "MMCVMultiScaleDeformableAttention", "DCNv3", "TRTDCNv3",
                     "DCNv4"], p.stdout
    assert p.stdout.strip().endswith("PASSED")


def test_gpu_check_script_tensorrt_only_msda_case_is_the_same_problem():
    """MultiscaleDeformableAttnPlugin_TRT in domain "" (TensorRT only; ONNX Runtime runs the name in the nvidia / trt
    / TRT domains) is the kit's case with int32 level tables and the output split per head: the same tables, feeds
    and expected values."""
    import onnx

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import check_tensorrt
    finally:
        sys.path.pop(0)
    by_name = {c[0]: c for c in check_tensorrt.msda_cases(np.random.default_rng(0))}
    assert "MultiscaleDeformableAttnPlugin_TRT" not in {
        c[0] for c in check_tensorrt.cases(np.random.default_rng(0), tensorrt_only=False)}
    _, kit, kit_feeds, kit_want, kit_prof = by_name["MultiScaleDeformableAttention"]
    _, trt, feeds, want, prof = by_name["MultiscaleDeformableAttnPlugin_TRT"]
    node = trt.graph.node[0]
    assert (node.op_type, node.domain, list(node.input)) == (
        "MultiscaleDeformableAttnPlugin_TRT", "", ["value", "shapes", "starts", "loc", "attn"])
    onnx.checker.check_model(kit)
    tables = {t.name: onnx.numpy_helper.to_array(t) for t in trt.graph.initializer}
    kit_tables = {t.name: onnx.numpy_helper.to_array(t) for t in kit.graph.initializer}
    assert {k: v.dtype for k, v in tables.items()} == {"shapes": np.int32, "starts": np.int32}
    assert {k: v.dtype for k, v in kit_tables.items()} == {"shapes": np.int64, "starts": np.int64}
    for k in tables:
        np.testing.assert_array_equal(tables[k], kit_tables[k])
    assert prof == kit_prof and all(np.array_equal(feeds[k], kit_feeds[k]) for k in feeds)
    n, q, m, d = want[0].shape
    assert kit_want[0].shape == (n, q, m * d)
    np.testing.assert_array_equal(want[0].reshape(n, q, m * d), kit_want[0])


@no_tensorrt
@pytest.mark.parametrize("extra", [[], ["--only-tools"], ["--skip-tools"], ["--min-max-dims"]])
def test_gpu_check_script_skips_without_tensorrt(extra):
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_tensorrt.py"), *extra], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and p.stdout.startswith("tensorrt: skipped: ") and len(p.stdout.splitlines()) == 1


def test_gpu_check_script_rejects_two_tool_modes():
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "check_tensorrt.py"), "--only-tools", "--skip-tools"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "not allowed with argument" in p.stderr


def _tool_checks():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import tensorrt_tool_checks
    finally:
        sys.path.pop(0)
    return tensorrt_tool_checks


def test_fp16_fpn_check_uses_boxes_whose_level_flips_in_float16():
    """The fp16 FPN case means something only if float16 boxes would pick another level than the float32 ones."""
    import onnx

    tc = _tool_checks()
    boxes = tc.fpn_boxes()
    assert list(tc.fpn_level(boxes)) == [1, 1]
    assert list(tc.fpn_level(boxes.astype(np.float16).astype(np.float32))) == [0, 0]
    model, feeds, want = tc.fpn_case(np.random.default_rng(0))
    onnx.checker.check_model(model)
    assert feeds["rois"].dtype == np.float32 and feeds["f0"].dtype == np.float16 and want.shape == (2, 2, 3, 3)
    # The reference pools the float32 boxes on level 1 (stride 8): equal to single-level RoIAlign there.
    from dcnkit import reference as ref

    level1 = ref.roi_align(feeds["f1"].astype(np.float64), boxes.astype(np.float64), (3, 3), 1 / 8, 2, True, "avg")
    np.testing.assert_allclose(want, level1, rtol=1e-12, atol=1e-12)


def test_min_max_dims_feeds_follow_the_profile():
    script = ROOT / "scripts" / "check_tensorrt.py"
    sys.path.insert(0, str(script.parent))
    try:
        import check_tensorrt
    finally:
        sys.path.pop(0)
    tc = _tool_checks()
    rng = np.random.default_rng(0)
    for name, model, _, _, prof in check_tensorrt.cases(rng):
        for which in (0, 2):
            feeds = tc.feeds_at(model, prof, which, rng)
            assert {k: v.shape for k, v in feeds.items()} == {k: tuple(v[which]) for k, v in prof.items()}, name
            batch = next(v.shape[0] for v in feeds.values() if v.ndim == 4)
            for v in feeds.values():
                if v.ndim == 2:  # RoIs: valid batch indices, x1 <= x2, y1 <= y2
                    assert (v[:, 0] >= 0).all() and (v[:, 0] < batch).all(), name
                    assert (v[:, 1] <= v[:, 3]).all() and (v[:, 2] <= v[:, 4]).all(), name


def test_tool_checks_skip_missing_tools(tmp_path, monkeypatch):
    tc = _tool_checks()
    monkeypatch.setattr(tc.shutil, "which", lambda _name: None)
    assert [r[1] for r in tc.check_sanitizer(tmp_path / "x.py")] == ["skipped: compute-sanitizer is not on PATH"]
    results = tc.check_trtexec([], tmp_path)
    assert [r[0] for r in results] == ["trtexec --dynamicPlugins", "trtexec --useCudaGraph"]
    assert all(r[1] == "skipped: trtexec is not on PATH" for r in results)
