"""The CUDA kernels compile with a CUDA 12 toolkit too (Jetson's JetPack 6 is CUDA 12.6, many containers are CUDA 12),
not only with the CUDA 13 of this machine's build: every plugins/core/src/*.cu with nvcc 12.4 for sm_87 (Jetson
Orin), the project's flags, no warning. The toolkit is scripts/cuda12_fetch.sh's (scripts/setup.sh fetches it into
.deps/cuda12; DCNKIT_CUDA12_HOME names another one); without it the test skips and says why."""
from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOME = Path(os.environ.get("DCNKIT_CUDA12_HOME") or ROOT / ".deps" / "cuda12")
NVCC = HOME / "bin" / "nvcc"


def _version() -> str:
    out = subprocess.run([str(NVCC), "--version"], capture_output=True, text=True).stdout
    return next((line for line in out.splitlines() if "release" in line), "")


@pytest.mark.skipif(not NVCC.is_file(), reason=f"no CUDA 12 nvcc at {NVCC} (bash scripts/cuda12_fetch.sh .deps, or set "
                                               "DCNKIT_CUDA12_HOME)")
def test_every_kernel_source_compiles_with_cuda_12(tmp_path):
    assert "release 12." in _version(), _version()
    sources = sorted((ROOT / "plugins" / "core" / "src").glob("*.cu"))
    assert len(sources) >= 10

    def compile_one(src: Path):
        r = subprocess.run([str(NVCC), "-std=c++17", "--expt-relaxed-constexpr", "-O3", "-arch=sm_87",
                            "-I", str(ROOT / "plugins" / "core" / "include"), "-c", str(src),
                            "-o", str(tmp_path / f"{src.stem}.o")], capture_output=True, text=True, timeout=600)
        return src.name, r.returncode, r.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(compile_one, sources))
    failed = [(name, err[-2000:]) for name, rc, err in results if rc != 0]
    assert not failed, failed
    warned = [(name, err[-1000:]) for name, _, err in results if "warning" in err]
    assert not warned, warned
