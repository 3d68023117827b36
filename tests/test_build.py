"""The build itself: CI must compile every CUDA file whenever nvcc is there (no GPU needed to compile)."""
import os
import shutil
from pathlib import Path

import pytest

import dcnkit


def _nvcc():
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    p = Path(home) / "bin" / "nvcc"
    return str(p) if p.is_file() else shutil.which("nvcc")


@pytest.mark.skipif(_nvcc() is None, reason="no nvcc on this machine: CUDA kernels are not compiled")
@pytest.mark.skipif(os.environ.get("DCNKIT_ALLOW_NO_CUDA") == "1",
                    reason="DCNKIT_ALLOW_NO_CUDA=1 (a developer build configured with -DDCNKIT_WITH_CUDA=OFF)")
def test_cuda_kernels_compiled_when_nvcc_is_present():
    assert dcnkit.cuda_compiled(), "nvcc is present but the torch library was built without CUDA kernels"
    cuda_lib = Path(dcnkit.ort_library()).with_name("libdcnkit_ort_cuda.so")
    assert cuda_lib.is_file(), f"nvcc is present but {cuda_lib} was not built"


def test_libraries_share_one_op_table():
    import ctypes
    import json

    tables = []
    for stem in ("dcnkit_torch", "dcnkit_ort"):
        lib = ctypes.CDLL(str(dcnkit.find_library(stem)))
        lib.dcnkit_op_defs_json.restype = ctypes.c_char_p
        tables.append(json.loads(lib.dcnkit_op_defs_json()))
    assert tables[0] == tables[1] == dcnkit.op_defs()
    assert [op["onnx_type"] for op in tables[0]["ops"]] == ["DeformConv2d", "RoIAlign", "DeformRoIPool",
                                                            "DeformPSRoIPool", "MultiLevelRoIAlign",
                                                            "MultiScaleDeformableAttention", "DCNv3", "DCNv4",
                                                            "RoIAlignRotated"]


def test_subpackages_are_reachable_from_the_top_level():
    # As in the README: `import dcnkit` then dcnkit.runtime.ort_session / dcnkit.export.to_onnx / dcnkit.reference.
    assert callable(dcnkit.runtime.ort_session)
    assert callable(dcnkit.export.to_onnx)
    assert callable(dcnkit.reference.deform_conv2d)
    with pytest.raises(AttributeError, match="no_such_thing"):
        dcnkit.no_such_thing
