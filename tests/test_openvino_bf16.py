"""The OpenVINO backend's bf16 mode (docs/openvino.md, "Reduced precision"): with ``inference_precision="bf16"`` on a
CPU that OpenVINO lists with BF16, the kit's ``DeformConv2d`` runs its GEMM on oneDNN's bf16 matmul (weight packed once
as bf16, columns rounded to bf16, float32 accumulation). Its output stays within the stated bf16 tolerance of
torchvision's float32 eager ``deform_conv2d`` and differs from the float32 GEMM's (the bf16 GEMM ran: the one-node
models have no other operation that bf16 could touch); float32 stays the default, within 1e-4, and unchanged by the
mode when ``dcn_gemm_precision="f32"``. Bad values are named."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from test_cpu_gemm_packed import CASES, IDS, _case, _model

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed (pip install dcnkit[openvino])")

from dcnkit.runtime.openvino import (  # noqa: E402
    GEMM_PRECISION_KEY, cpu_has_bf16, extension_library, openvino_reason, resolve_gemm_precision)

pytestmark = pytest.mark.skipif(openvino_reason() is not None, reason=f"openvino backend: {openvino_reason()}")

# The DCN output's largest difference from float32, relative to its largest value, that the bf16 GEMM may make
# (docs/openvino.md): the weight and columns rounded to 8 significant bits (2^-9 relative each), summed in float32.
BF16_RTOL = 1e-2
# Less than any bf16 GEMM of these cases differs from float32 by (measured 8e-4 - 2.6e-3, relative to the output's
# scale); the float32 GEMM is within 6e-7 of torchvision.
BF16_MIN_DIFF = 1e-4
F32_RTOL = 1e-4


def _onednn3_installed() -> bool:
    return any(os.path.exists(os.path.join(d, "lib", "libdnnl.so.3")) for d in (sys.prefix, sys.base_prefix))


def _bf16_reason() -> str | None:
    if not cpu_has_bf16(ov.Core()):
        return "OpenVINO lists no BF16 for this CPU (needs AVX-512 BF16 or AMX): the bf16 mode runs in float32"
    if not _onednn3_installed():
        return "oneDNN 3.x is not installed here (pip install onednn-cpu-gomp): no packed GEMM, bf16 or float32"
    return None


needs_bf16 = pytest.mark.skipif(_bf16_reason() is not None, reason=str(_bf16_reason()))


def _torchvision_f32(d, case):
    """torchvision's eager float32 deform_conv2d of the case (an implementation independent of the kit)."""
    import torch
    from torchvision.ops import deform_conv2d

    stride = case[5]
    t = {k: torch.from_numpy(v) for k, v in d.items()}
    with torch.no_grad():
        return deform_conv2d(t["x"], t["offset"], t["weight"], t.get("bias"), stride=stride, padding=1,
                             mask=t.get("mask")).numpy()


def _run(model, feeds, **options):
    from dcnkit.runtime.openvino import OpenVINORunner

    runner = OpenVINORunner(model.SerializeToString(), num_threads=2, **options)
    try:
        outs = [runner.run(feeds)["y"] for _ in range(2)]  # the first run packs the weight, the second reads it
        np.testing.assert_array_equal(outs[0], outs[1])
        return runner.gemm_precision, outs[1]
    finally:
        runner.close()


def _rel(got, want):
    return float(np.abs(got - want).max() / np.abs(want).max())


@needs_bf16
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_bf16_gemm_is_within_its_tolerance_and_is_not_float32(case):
    d, _ = _case(case)
    model = _model(case, d)
    feeds = {i.name: d[i.name] for i in model.graph.input}
    want = _torchvision_f32(d, case)
    precision, bf16 = _run(model, feeds, inference_precision="bf16")
    assert precision == "bf16"
    assert _rel(bf16, want) < BF16_RTOL
    precision, f32 = _run(model, feeds, inference_precision="bf16", dcn_gemm_precision="f32")
    assert precision == "f32"
    assert _rel(f32, want) < F32_RTOL
    assert _rel(bf16, f32) > BF16_MIN_DIFF  # the bf16 GEMM ran


@pytest.mark.parametrize("case", CASES[:2], ids=IDS[:2])
def test_float32_stays_the_default_and_the_f32_gemm_is_unchanged_by_the_bf16_hint(case):
    d, _ = _case(case)
    model = _model(case, d)
    feeds = {i.name: d[i.name] for i in model.graph.input}
    precision, default = _run(model, feeds)
    assert precision == "f32"
    assert _rel(default, _torchvision_f32(d, case)) < F32_RTOL
    # One kit node and nothing else: the bf16 hint with the float32 GEMM computes the same bits.
    _, f32_gemm = _run(model, feeds, inference_precision="bf16", dcn_gemm_precision="f32")
    np.testing.assert_array_equal(f32_gemm, default)


class _Core:
    def __init__(self, capabilities):
        self.capabilities = capabilities

    def get_property(self, device, name):
        assert (device, name) == ("CPU", "OPTIMIZATION_CAPABILITIES")
        return self.capabilities


def test_the_gemm_precision_follows_the_compiled_precision_where_not_asked():
    with_bf16, without = _Core(["FP32", "BF16", "INT8"]), _Core(["FP32", "INT8"])
    assert resolve_gemm_precision(with_bf16, "CPU", "bf16", None) == "bf16"
    assert resolve_gemm_precision(without, "CPU", "bf16", None) == "f32"  # OpenVINO keeps float32 there too
    assert resolve_gemm_precision(with_bf16, "CPU", "f32", None) == "f32"
    assert resolve_gemm_precision(with_bf16, "CPU", "f16", None) == "f32"
    assert resolve_gemm_precision(with_bf16, "GPU", "bf16", None) == "f32"
    assert resolve_gemm_precision(without, "CPU", "f32", "bf16") == "bf16"  # asked


def test_bad_gemm_precisions_are_named(tmp_path):
    from dcnkit.runtime.openvino import OpenVINORunner

    d, _ = _case(CASES[0])
    model = _model(CASES[0], d)
    with pytest.raises(ValueError, match=r"dcn_gemm_precision: expected one of 'f32', 'bf16', got 'fp16'"):
        OpenVINORunner(model.SerializeToString(), dcn_gemm_precision="fp16")
    # The extension's own check of the rt_info entry (an IR or model told by other code than the backend's).
    path = tmp_path / "dcn.onnx"
    path.write_bytes(model.SerializeToString())
    core = ov.Core()
    core.add_extension(str(extension_library()))
    m = core.read_model(str(path))
    (node,) = [op for op in m.get_ops() if op.get_type_name() == "DeformConv2d"]
    node.get_rt_info()[GEMM_PRECISION_KEY] = "half"
    request = core.compile_model(m, "CPU", {"INFERENCE_NUM_THREADS": 2}).create_infer_request()
    with pytest.raises(Exception, match=r"DeformConv2d node .*rt_info dcnkit_gemm_precision: expected \"f32\" or "
                                        r"\"bf16\", got \"half\""):
        request.start_async({k: d[k] for k in ("x", "offset", "mask")})
        request.wait()


_CHILD = """
import sys
sys.path.insert(0, sys.argv[1])
import test_openvino_bf16 as t
d, _ = t._case(t.CASES[0])
model = t._model(t.CASES[0], d)
precision, got = t._run(model, {i.name: d[i.name] for i in model.graph.input}, dcn_gemm_precision="bf16")
print(precision, t._rel(got, t._torchvision_f32(d, t.CASES[0])))
"""


@pytest.mark.skipif(not _onednn3_installed(), reason="oneDNN 3.x is not installed here (pip install onednn-cpu-gomp)")
def test_where_onednn_has_no_bf16_matmul_the_gemm_stays_float32_and_says_so():
    """oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA) has only its reference bf16 matmul: the node keeps the float32 GEMM
    and prints one line."""
    import subprocess

    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2")
    p = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if "no bfloat16 matmul" in ln]
    assert len(lines) == 1 and "the DCN GEMM runs in float32" in lines[0], p.stderr
    precision, err = p.stdout.split()[-2:]
    assert precision == "bf16" and float(err) < F32_RTOL  # asked for, and computed in float32
