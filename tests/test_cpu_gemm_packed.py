"""The packed-weight CPU GEMM of the ONNX Runtime library (dcnkit/cpu_gemm.h): a constant DeformConv2d weight packed
once into oneDNN's layout at kernel creation, a weight that is a graph input (reordered and packed by OpenBLAS on
every run), and the library without oneDNN (DCNKIT_ONEDNN_LIB naming no library: OpenBLAS, one line saying so), each
against the float64 reference of docs/operators.md (dcnkit.reference). The shapes cover what the packed path splits:
row blocks of 64 with a partial last one (130 output channels), convolution groups (strided columns), a small map whose
GEMM is split by output rows, a map of many column tiles, stride 2, a batch of 2 and no bias or mask."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session

# (N, Cin, Cout, H, W, stride, groups, deformable groups, bias, mask)
CASES = [
    (1, 64, 130, 9, 9, 1, 1, 1, True, True),    # 3 row blocks, the last of 2 rows
    (2, 32, 128, 10, 10, 2, 2, 2, True, True),  # groups: each group's columns strided in the tile
    (1, 256, 256, 7, 7, 1, 1, 1, True, True),   # one tile per task: GEMM split at row blocks
    (1, 16, 64, 40, 40, 1, 1, 1, False, False),  # DCNv1, many column tiles
]
IDS = ["c130-partial-block", "groups2-stride2-n2", "c256-7x7-split-rows", "dcnv1-40x40-tiles"]


def _case(case, seed=0):
    n, cin, cout, h, w, s, g, dg, bias, mask = case
    rng = np.random.default_rng(seed)
    ho, wo = (h - 1) // s + 1, (w - 1) // s + 1
    d = {
        "x": rng.standard_normal((n, cin, h, w)).astype(np.float32),
        "offset": (rng.standard_normal((n, 2 * dg * 9, ho, wo)) * 2).astype(np.float32),
        "weight": (rng.standard_normal((cout, cin // g, 3, 3)) / (cin // g * 9) ** 0.5).astype(np.float32),
    }
    if bias:
        d["bias"] = rng.standard_normal(cout).astype(np.float32)
    if mask:
        d["mask"] = rng.uniform(0, 1, (n, dg * 9, ho, wo)).astype(np.float32)
    want = ref.deform_conv2d(d["x"], d["offset"], d["weight"], d.get("bias"), stride=(s, s), padding=(1, 1),
                             mask=d.get("mask"))
    return d, want


def _model(case, d, constant_weight=True):
    n, cin, cout, h, w, s, g, dg, bias, mask = case
    names = ["x", "offset", "weight", "bias" if bias else "", "mask" if mask else ""]
    while not names[-1]:
        names.pop()
    consts = ["weight", "bias"] if constant_weight else ["bias"]
    f = TensorProto.FLOAT
    node = helper.make_node("DeformConv2d", names, ["y"], domain="dcnkit", stride=[s, s], padding=[1, 1],
                            groups=g, deformable_groups=dg, plugin_namespace="dcnkit")
    inputs = [helper.make_tensor_value_info(k, f, list(d[k].shape)) for k in names if k and k not in consts]
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", f, None)],
                              initializer=[numpy_helper.from_array(d[k], k) for k in consts if k in d])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid("dcnkit", 1)],
                             ir_version=9)


def _run(case, constant_weight):
    d, want = _case(case)
    model = _model(case, d, constant_weight)
    feeds = {i.name: d[i.name] for i in model.graph.input}
    got = ort_session(model, providers=["CPUExecutionProvider"], intra_op_num_threads=2).run(None, feeds)[0]
    return got, want


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("constant_weight", [True, False], ids=["constant-weight", "weight-input"])
def test_the_cpu_gemm_matches_the_float64_reference(case, constant_weight):
    got, want = _run(case, constant_weight)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def _openvino_unavailable():
    from dcnkit.runtime.registry import available_backends

    return available_backends().get("openvino")


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("constant_weight", [True, False], ids=["constant-weight", "weight-input"])
def test_the_openvino_kernel_matches_the_float64_reference(case, constant_weight):
    """The same GEMM inside OpenVINO (libdcnkit_ov.so): a constant weight packed at the node's first run and reused
    by the second, a weight input packed on every run."""
    reason = _openvino_unavailable()
    if reason:
        pytest.skip(reason)
    from dcnkit.runtime.registry import make_runner

    d, want = _case(case)
    model = _model(case, d, constant_weight)
    runner = make_runner(model.SerializeToString(), "openvino", num_threads=2)
    feeds = {i.name: d[i.name] for i in model.graph.input}
    for _ in range(2):  # the first run packs a constant weight, the second reads it packed
        got = runner.run(feeds)["y"]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    runner.close()


_CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import numpy as np
    import test_cpu_gemm_packed as t
    worst = 0.0
    for case in t.CASES:
        got, want = t._run(case, constant_weight=True)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    maps = open("/proc/self/maps").read()
    print("worst", worst)
    print("libdnnl.so.3 mapped", "libdnnl.so.3" in maps)
""")


def _child(env_extra):
    env = dict(os.environ, **env_extra)
    p = subprocess.run([sys.executable, "-c", _CHILD, os.path.dirname(__file__)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p


def _onednn3_installed() -> bool:
    return any(os.path.exists(os.path.join(d, "lib", "libdnnl.so.3")) for d in (sys.prefix, sys.base_prefix))


@pytest.mark.skipif(not _onednn3_installed(), reason="oneDNN 3.x is not installed here (pip install onednn-cpu-gomp)")
def test_constant_weights_run_on_onednn_where_it_is_installed():
    p = _child({})
    assert "weights not packed" not in p.stderr, p.stderr
    assert "libdnnl.so.3 mapped True" in p.stdout
    assert float(p.stdout.split("worst ")[1].split()[0]) < 1e-4


def test_without_onednn_the_library_runs_on_openblas_and_says_so_once():
    p = _child({"DCNKIT_ONEDNN_LIB": "/nonexistent/libdnnl.so.3"})
    lines = [ln for ln in p.stderr.splitlines() if "weights not packed" in ln]
    assert len(lines) == 1, p.stderr  # once per process, on one line
    assert "OpenBLAS" in lines[0] and "/nonexistent/libdnnl.so.3" in lines[0] and "onednn-cpu-gomp" in lines[0]
    assert "libdnnl.so.3 mapped False" in p.stdout
    assert float(p.stdout.split("worst ")[1].split()[0]) < 1e-4
