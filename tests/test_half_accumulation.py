"""The 16-bit path of the DCNv3 / DCNv4 and multi-scale deformable attention CUDA kernels without a GPU: their
per-thread bodies instantiated for a bfloat16 storage type with float32 accumulation, run over the CUDA launch grid
on the host, and the final rounding of the float32 gradient buffers (tests/cpp/half_accumulation_test.cpp: each
16-bit result is the float32 computation on the same data rounded once); and the int32 level tables' widening
kernel body over its grid."""
from cpp_unit import ROOT, run_cpp_unit


def test_16_bit_results_are_the_float32_computation_rounded_once(tmp_path):
    out = run_cpp_unit("half_accumulation_test.cpp", ROOT / "plugins" / "core" / "include", tmp_path)
    passed, failed = (int(w) for w in out.split()[-4::2])
    assert failed == 0 and passed > 10000, out
