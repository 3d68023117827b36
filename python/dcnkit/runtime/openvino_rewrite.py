"""Which standard ``DeformConv`` nodes run on the kit's kernel under OpenVINO: a per-node rule, measured, applied as
an in-memory rewrite to ``dcnkit::DeformConv2d`` before OpenVINO reads the model (the file is not touched).

The kit's extension library converts standard ``DeformConv`` to OpenVINO's own DeformableConvolution-8 (with
``bilinear_interpolation_pad``, the same function) and ``dcnkit::DeformConv2d`` to the kit's kernel; the rewrite
itself is :func:`dcnkit.runtime.ort_rewrite.rewrite_deform_conv` (exact; nodes the kit cannot represent, e.g.
asymmetric padding, stay on OpenVINO's op).
"""
from __future__ import annotations

from typing import Any

from dcnkit.runtime.ort_rewrite import rewrite_deform_conv

__all__ = ["KIT_MIN_OUTPUT_POSITIONS", "kit_is_faster", "prepare_onnx"]

# The measured rule (benchmarks/bench_openvino.py --layers): see docs/openvino.md "Which kernel runs a DeformConv".
KIT_MIN_OUTPUT_POSITIONS = 0


def kit_is_faster(out_hw: tuple | None) -> bool:
    """Whether the kit's kernel is the faster one under OpenVINO (CPU) for a DeformConv node whose output map is
    ``out_hw`` = (Ho, Wo), or None (or a None size) where it is not known."""
    if out_hw is None or any(d is None for d in out_hw):
        return True
    ho, wo = out_hw
    return ho * wo >= KIT_MIN_OUTPUT_POSITIONS


def prepare_onnx(model: Any, deform_conv: str = "auto") -> tuple[Any, int]:
    """(the model OpenVINO reads, standard DeformConv nodes moved to the kit's kernel). ``deform_conv``: ``"auto"``
    (the rule above), ``"kit"`` (every node the kit can represent) or ``"openvino"`` (none)."""
    if deform_conv == "openvino":
        return model, 0
    if deform_conv == "kit":
        return rewrite_deform_conv(model)
    if deform_conv == "auto":
        return rewrite_deform_conv(model, rule=kit_is_faster)
    raise ValueError(f"deform_conv: expected 'auto', 'kit' or 'openvino', got {deform_conv!r}")
