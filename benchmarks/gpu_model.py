"""The time model printed beside each GPU figure of benchmarks/gpu_report.py (labelled "model").

A kernel takes max(t_issue, t_dram):
  t_issue = elements / 32 * (SASS instructions per element) / R,  R = 7.9e11 warp-instructions/s
  t_dram  = bytes / BW,                                           BW = 3.0e12 B/s (H100 SXM, HBM3)
R was fitted on torchvision's im2col at (8, 32, 128, 128) fp32 on an H100 (0.17 ms at about 114 SASS per column
element); the same constant predicted dcnkit's old im2col at 0.76 ms (measured 0.79). A GEMM takes
2 M N K / F (F = 50 TFLOP/s for fp32 with TF32 off, 300 for fp16 / bf16), and no less than reading its column
operand. SASS per element comes from scripts/kernel_report.py where it can run (the gated kernels), else from
the defaults below. Kernel time only: launches and host work are not modelled.
"""
from __future__ import annotations

R = 7.9e11           # warp-instructions per second
BW = 3.0e12          # DRAM bytes per second
GEMM_FLOPS = {"float32": 50e12, "float16": 300e12, "bfloat16": 300e12}
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}

# SASS per element when the kernel report is not at hand: its figures for the current kernels (2026-11-25, nvcc 13.0,
# sm_90), taken as benchmarks/gpu_report.py takes them from a live report -- the slowest float instantiation: the DCN
# gather (31-37 per column element at the shortest 16-channel slice; 130-173 before the sampling point was computed
# once per slice in 32-bit arithmetic), the fused sampling backward (47-51 at the shortest 32-channel slice; 394-422
# before the window rewrite), RoIAlign's plan forward (219-220 per output at sampling ratio 2; 368 before);
# RoIAlign's backward: an estimate, not a count (the report has no per-element figure for it).
DEFAULT_SASS = {"dcn_gather": 37.0, "dcn_backward": 51.0, "roi_align_forward": 220.0, "roi_align_backward": 400.0}


def kernel_ms(elements: float, sass_per_element: float, bytes_moved: float) -> float:
    t_issue = elements / 32.0 * sass_per_element / R
    return 1e3 * max(t_issue, bytes_moved / BW)


def gemm_ms(m: float, n: float, k: float, dtype: str, operand_bytes: float) -> float:
    return 1e3 * max(2.0 * m * n * k / GEMM_FLOPS[dtype], operand_bytes / BW)


def dcn_ms(shape, dtype: str, sass: dict, backward: bool = False) -> float:
    """DCNv2 3x3, C_out = C, pad 1: the gather into columns, then the GEMM into the output (forward); backward adds
    the column-gradient and weight-gradient GEMMs, the gather again and the sampling backward."""
    n, c, h, w = shape
    e = n * c * 9 * h * w                                     # column elements
    eb = ELEMENT_BYTES[dtype]
    io = (2 * n * c * h * w + n * 27 * h * w) * eb            # input, output, offset + mask
    gather = kernel_ms(e, sass["dcn_gather"], e * eb + io)
    gemm = gemm_ms(c, n * h * w, c * 9, dtype, e * eb)
    if not backward:
        return gather + gemm
    sampling = kernel_ms(e, sass["dcn_backward"], e * eb + 2 * io)
    return 2 * (gather + gemm) + gemm + sampling


def roi_align_ms(num_rois: int, channels: int, pooled: int, dtype: str, sass: dict, backward: bool = False) -> float:
    """RoIAlign (one output element per (RoI, channel, bin)): loads of the 4 taps of each sample mostly hit L2, so
    the bytes are the output (forward) or the output gradient and the input gradient's atomics (backward)."""
    o = num_rois * channels * pooled * pooled
    eb = ELEMENT_BYTES[dtype]
    fwd = kernel_ms(o, sass["roi_align_forward"], o * eb)
    if not backward:
        return fwd
    return fwd + kernel_ms(o, sass["roi_align_backward"], o * eb + 16 * o * 4)
