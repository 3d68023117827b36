"""What the deployment side costs: import time and resident memory of fresh interpreters that import
onnxruntime alone, dcnkit, and dcnkit.runtime with a DCNv2 model loaded and run once, against the same with
torch imported as well (what every dcnkit process paid before the torch side became lazy).

    python benchmarks/bench_deploy_footprint.py [--runs 7]

Each case runs in its own interpreter, the cases interleaved, ``--runs`` times; the table shows the fastest
import, the fastest import + work (session creation and one run where there is work), and the median resident
set (VmRSS) after the case's work."""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

_MEASURE = textwrap.dedent("""
    import json, sys, time
    t0 = time.perf_counter()
    {imports}
    t_import = time.perf_counter() - t0
    {work}
    t_total = time.perf_counter() - t0
    rss = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS:")][0]
    print(json.dumps({{"import_s": t_import, "total_s": t_total, "rss_kb": rss, "torch": "torch" in sys.modules}}))
""")

_RUN_DCN = textwrap.dedent("""
    import numpy as np
    from dcnkit.runtime import ort_session
    sess = ort_session(sys.argv[1], providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    sess.run(None, {"input": rng.standard_normal((1, 64, 64, 64), dtype=np.float32),
                    "offset": rng.standard_normal((1, 18, 64, 64), dtype=np.float32),
                    "mask": rng.uniform(size=(1, 9, 64, 64)).astype(np.float32)})
""")

CASES = {
    "onnxruntime alone": ("import onnxruntime", ""),
    "import dcnkit": ("import dcnkit", ""),
    "dcnkit.runtime + DCNv2 session, 1 run": ("import dcnkit.runtime", _RUN_DCN),
    "dcnkit.server + dcnkit.cli (import only)": ("import dcnkit.server.app, dcnkit.cli", ""),
    "torch + dcnkit (the old eager import)": ("import torch, dcnkit", ""),
    "torch + dcnkit.runtime + DCNv2 session, 1 run": ("import torch, dcnkit.runtime", _RUN_DCN),
}


def _dcnv2_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    c = 64
    vi = helper.make_tensor_value_info
    node = helper.make_node("DeformConv2d", ["input", "offset", "weight", "bias", "mask"], ["output"],
                            domain="dcnkit", stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1,
                            deformable_groups=1)
    g = helper.make_graph(
        [node], "dcnv2",
        [vi("input", TensorProto.FLOAT, ["N", c, 64, 64]), vi("offset", TensorProto.FLOAT, ["N", 18, 64, 64]),
         vi("mask", TensorProto.FLOAT, ["N", 9, 64, 64])],
        [vi("output", TensorProto.FLOAT, ["N", c, 64, 64])],
        [onnx.numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) * 0.05).astype(np.float32), "weight"),
         onnx.numpy_helper.from_array(np.zeros(c, np.float32), "bias")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("dcnkit", 1)])
    m.ir_version = 9
    onnx.save(m, str(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "dcnv2.onnx"
        _dcnv2_model(model)
        results = {name: [] for name in CASES}
        for _ in range(args.runs):
            for name, (imports, work) in CASES.items():
                code = _MEASURE.format(imports=imports, work=work.strip())
                out = subprocess.run([sys.executable, "-c", code, str(model)], check=True, capture_output=True,
                                     text=True, timeout=300).stdout
                results[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{'case':<48} {'import ms':>10} {'total ms':>9} {'RSS MB':>7} {'torch loaded':>13}")
    for name, rs in results.items():
        imp = min(r["import_s"] for r in rs) * 1e3
        total = min(r["total_s"] for r in rs) * 1e3
        rss = statistics.median(r["rss_kb"] for r in rs) / 1024
        print(f"{name:<48} {imp:>10.0f} {total:>9.0f} {rss:>7.0f} {str(rs[0]['torch']):>13}")


if __name__ == "__main__":
    main()
