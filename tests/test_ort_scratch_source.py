"""Where the ONNX Runtime CUDA-EP kernels take their scratch memory (plugins/onnxruntime/ort_scratch_source.h), checked
on the CPU: ONNX Runtime's scratch buffer from C API 18; below it CUDA's stream-ordered pool (cudaMallocAsync) only
where the device supports memory pools (cudaDevAttrMemoryPoolsSupported), else ONNX Runtime's allocator, freed
after a stream synchronisation; the DCNKIT_ORT_CUDA_SCRATCH override only where the setup allows it. The paths
themselves run on a GPU in tests/test_ort_cuda_ep.py (skipped without one)."""
from cpp_unit import ROOT, run_cpp_unit


def test_scratch_source_decision(tmp_path):
    out = run_cpp_unit("ort_scratch_source_test.cpp", ROOT / "plugins" / "onnxruntime", tmp_path)
    passed, failed = (int(w) for w in out.split()[-3::2])
    assert failed == 0 and passed >= 20, out
