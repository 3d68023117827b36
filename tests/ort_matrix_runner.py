"""Runs the version matrix's cases (tests/ort_matrix_cases.py) in a venv that holds only ``onnxruntime`` and NumPy, as
a new user would: no dcnkit import; the custom-op library registered by path.

    python ort_matrix_runner.py CASES_DIR LIBRARY [CASE_NAME ...]

Prints one JSON object: the ONNX Runtime version and, per case, "ok" (every output within 1e-4 relative of the eager
PyTorch output saved beside the file), "mismatch" (with the largest relative error) or "error" (with ONNX Runtime's
message).
"""
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort

RTOL = 1e-4
ATOL = 1e-5  # values that are zero in the eager output


def run_case(case: dict, cases_dir: Path, library: str) -> dict:
    try:
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        so.register_custom_ops_library(library)
        sess = ort.InferenceSession(str(cases_dir / case["file"]), so, providers=["CPUExecutionProvider"])
        with np.load(cases_dir / case["inputs"]) as z:
            feeds = {k: z[k] for k in z.files}
        outs = sess.run(None, feeds)
    except Exception as e:  # noqa: BLE001 - reported, the caller decides
        return {"status": "error", "message": str(e).strip().splitlines()[-1][:500]}
    with np.load(cases_dir / case["want"]) as z:
        wants = [z[f"output_{i}"] for i in range(len(z.files))]
    if len(outs) != len(wants):
        return {"status": "mismatch", "message": f"{len(outs)} outputs, expected {len(wants)}"}
    worst = 0.0
    for got, want in zip(outs, wants):
        if got.shape != want.shape:
            return {"status": "mismatch", "message": f"shape {got.shape}, expected {want.shape}"}
        diff = np.abs(got.astype(np.float64) - want)
        bad = int(np.count_nonzero(~(diff <= ATOL + RTOL * np.abs(want))))  # NaN counts as bad
        worst = max(worst, float(np.max(diff, initial=0.0)))
        if bad:
            return {"status": "mismatch", "message": f"{bad} of {want.size} elements off by more than "
                                                      f"{ATOL} + {RTOL} * |eager|; largest difference {worst:.3g}"}
    return {"status": "ok", "max_abs_diff": worst}


def main() -> int:
    cases_dir, library = Path(sys.argv[1]), sys.argv[2]
    only = set(sys.argv[3:])
    cases = json.loads((cases_dir / "manifest.json").read_text())
    results = {c["name"]: run_case(c, cases_dir, library) for c in cases if not only or c["name"] in only}
    print(json.dumps({"onnxruntime": ort.__version__, "numpy": np.__version__, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
