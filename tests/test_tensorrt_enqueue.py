"""The TensorRT plugins' enqueue on device buffers, driven by the host lifecycle harness without TensorRT
(scripts/check_trt_enqueue.py, tests/cpp/tensorrt_enqueue_cuda.cpp; issue 25 item 7).

On a GPU (marked `cuda`, run by .ci/gpu): every plugin kind (and mmdeploy's / InternImage's names of the same nodes)
in float32, float16 and bfloat16 is enqueued on a CUDA stream and its outputs are compared with the torch op.
Everywhere: the harness compiles, the manifest's cases pass the plugins' host half (fields, output shapes, formats,
configurePlugin, workspace), a wrong case fails it, and the comparison rejects wrong, unwritten (NaN) or missing
outputs."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_trt_enqueue as E  # noqa: E402

sys.path.pop(0)


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    try:
        lib = E.plugin_library()
        exe = E.build_harness(tmp_path_factory.mktemp("enqueue"))
    except E.Skip as e:
        pytest.skip(str(e))
    return exe, lib


def test_every_case_passes_the_plugins_host_half(harness):
    lines = []
    rows = E.run(plan=True, log=lines.append, exe=harness[0])
    assert rows is not None, lines
    assert len(rows) == 18 * len(E.DTYPES)
    assert {r["plugin"].split("-")[0] for r in rows} == {
        "DeformConv2d", "RoIAlign", "DeformRoIPool", "DeformPSRoIPool", "MultiLevelRoIAlign",
        "MultiScaleDeformableAttention", "DCNv3", "DCNv4", "MMCVDeformConv2d", "MMCVModulatedDeformConv2d",
        "MMCVRoiAlign", "MMCVDeformRoIPool", "MMCVMultiLevelRoiAlign", "MMCVMultiScaleDeformableAttention", "TRTDCNv3"}
    assert [r for r in rows if not r["passed"]] == []


def test_the_host_half_fails_a_wrong_output_shape_and_an_unknown_plugin(harness, tmp_path):
    exe, lib = harness
    import torch

    case = E.cases("float32")[0]  # DeformConv2d v2: output (2, 6, 12, 10)
    manifest = E.write_manifest([case], tmp_path).read_text()
    assert " 4 2 6 12 10\n" in manifest
    (tmp_path / "m1.txt").write_text(manifest.replace(" 4 2 6 12 10\n", " 4 2 6 12 11\n"))
    (tmp_path / "m2.txt").write_text(manifest.replace(" DeformConv2d dcnkit", " DeformConv3d dcnkit"))
    for name, why in (("m1.txt", "output 0: the plugin's shape differs"), ("m2.txt", "no creator DeformConv3d")):
        r = subprocess.run([str(exe), str(lib), str(tmp_path / name), "--plan"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 1 and why in r.stdout and r.stdout.strip().endswith("0 passed, 1 failed"), r.stdout
    assert torch.is_tensor(case.expected[0])


def test_without_a_device_the_harness_says_so(harness, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the device run is tested below")
    exe, lib = harness
    manifest = E.write_manifest(E.cases("float32")[:1], tmp_path)
    r = subprocess.run([str(exe), str(lib), str(manifest)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 3 and r.stdout.startswith("no CUDA device"), r.stdout + r.stderr


@pytest.mark.parametrize("dtype", E.DTYPES)
def test_the_comparison_accepts_the_op_and_rejects_wrong_outputs(tmp_path, dtype):
    """Outputs written as the harness writes them: the torch op run in `dtype` on the CPU passes; one element
    off by 10 tolerances, an unwritten output (NaN, the harness's fill), a failed case or a case without a line (the
    harness crashed there) fails."""
    import torch

    all_cases = E.cases(dtype)
    E.write_manifest(all_cases, tmp_path)

    def write(i, c, tweak=None):
        got = c.op(*c.inputs)  # the kit's CPU op in the case's own type: a real 16-bit implementation
        for j, g in enumerate(got):
            g = g.to(getattr(torch, dtype)).contiguous()
            if tweak is not None and j == 0:
                g.view(-1)[0] = tweak(g.view(-1)[0])
            (tmp_path / f"c{i}_out{j}.raw").write_bytes(E._raw(g))

    ok = {f"{c.label}-{c.dtype}": f"ok {c.label}-{c.dtype}" for c in all_cases}
    for i, c in enumerate(all_cases):
        write(i, c)
    rows = E.compare(all_cases, tmp_path, ok)
    assert [r["plugin"] for r in rows if not r["passed"]] == [], rows
    assert all(r["max_err"] <= r["allowed"] for r in rows)
    scale = max(1.0, float(all_cases[0].expected[0].abs().max()))
    write(0, all_cases[0], lambda v: v + 10 * E.TOL[dtype] * scale)
    write(1, all_cases[1], lambda v: float("nan"))
    lines = dict(ok, **{f"{all_cases[2].label}-{dtype}": f"FAILED {all_cases[2].label}-{dtype}: enqueue returned -1"})
    del lines[f"{all_cases[3].label}-{dtype}"]  # the harness crashed in this case: no line
    rows = E.compare(all_cases, tmp_path, lines, missing="no line from the harness (exit -11: )")
    assert [r["plugin"] for r in rows if not r["passed"]] == [c.label for c in all_cases[:4]], rows
    assert rows[2]["note"].endswith("enqueue returned -1") and rows[1]["max_err"] == float("inf")
    assert rows[3]["note"] == "no line from the harness (exit -11: )" and rows[3]["max_err"] is None


@pytest.mark.cuda
def test_every_plugin_enqueue_on_device_buffers_matches_the_torch_op(harness):
    lines = []
    rows = E.run(log=lines.append, exe=harness[0])
    assert rows is not None, lines
    print(E.table(rows))
    assert [r for r in rows if not r["passed"]] == []
