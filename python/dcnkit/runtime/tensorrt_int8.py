"""INT8 for TensorRT (explicit quantization): a QDQ model as ``dcnkit quantize`` writes it, made into the Q/DQ form
TensorRT's ONNX parser takes.

>>> from dcnkit.runtime.tensorrt_int8 import tensorrt_qdq
>>> proto, report = tensorrt_qdq(onnx.load("m.int8.onnx"))     # what ``dcnkit build --int8`` does before parsing

TensorRT quantizes symmetrically: its QuantizeLinear / DequantizeLinear take signed int8 with zero point 0
(weights and activations), and its DequantizeLinear takes int8 (or fp8 / int4) tensors, not int32 ones. ONNX
Runtime's tool, on the CPU, writes uint8 activations with a zero point (asymmetric: every value of the calibrated
range [lo, hi] on 256 steps) and int32 biases behind a DequantizeLinear. :func:`tensorrt_qdq` rewrites exactly
those, and nothing else:

- a uint8 Q/DQ pair's (scale s, zero point z) becomes (s', 0) in int8 with ``s' = s * max(z, 255 - z) / 127``:
  the symmetric int8 grid that covers the same calibrated range [lo, hi] = [-s z, s (255 - z)] (a range on one side
  of zero, as after a ReLU, gets half the resolution: that is TensorRT's scheme, not a loss this rewrite adds), and
  a ``Clip(lo, hi)`` goes before the QuantizeLinear, because the uint8 QuantizeLinear clips there and the tool
  relies on it: it drops a ReLU in front of a uint8 QuantizeLinear with zero point 0 (that clip is the ReLU);
- a DequantizeLinear of a constant int32 tensor (a bias) becomes the float32 constant it computes;
- int8 weights with zero point 0 stay as they are (TensorRT dequantizes constant int8 weights itself).

Anything else TensorRT would refuse (an int8 zero point that is not 0, a scale or zero point that is not a
constant) raises ValueError naming the node. The kit's nodes stay float between DequantizeLinear and QuantizeLinear:
the plugins take float32 / float16 / bfloat16 (their ``supportsFormatCombination``), and TensorRT runs the Q/DQ
around them as its own layers.

The rewritten model is an ordinary ONNX model: it runs in ONNX Runtime (the tests compare it there with the model
``dcnkit quantize`` wrote and with an independent NumPy fake quantization), which is as far as this path is checked
on machines without TensorRT.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

QDQ_OPS = ("QuantizeLinear", "DequantizeLinear")
_ONNX_DOMAINS = ("", "ai.onnx")


@dataclass
class Int8Report:
    """What :func:`tensorrt_qdq` changed."""

    quantize: int = 0  # QuantizeLinear nodes in the model
    dequantize: int = 0  # DequantizeLinear nodes in the model
    activations: list = field(default_factory=list)  # (scale name, zero point, resolution factor s'/s)
    biases: int = 0  # int32 DequantizeLinear folded into float32 constants

    def summary(self) -> str:
        parts = [f"{self.quantize} QuantizeLinear / {self.dequantize} DequantizeLinear"]
        if self.activations:
            worst = max(f for *_, f in self.activations)
            parts.append(f"{len(self.activations)} uint8 activation scales made symmetric int8 (zero point 0; "
                         f"step up to {worst:.2f}x the uint8 one)")
        if self.biases:
            parts.append(f"{self.biases} int32 biases folded to float32")
        return ", ".join(parts)


def qdq_counts(proto) -> tuple[int, int]:
    """(QuantizeLinear, DequantizeLinear) node counts of the main graph."""
    ops = [n.op_type for n in proto.graph.node]
    return ops.count("QuantizeLinear"), ops.count("DequantizeLinear")


def require_qdq(proto, name: str = "the model") -> tuple[int, int]:
    """The Q/DQ counts; ValueError when the model has no QuantizeLinear and no DequantizeLinear (a float model:
    TensorRT 11 has no INT8 calibration, so INT8 needs the Q/DQ nodes ``dcnkit quantize`` writes)."""
    nq, ndq = qdq_counts(proto)
    if nq + ndq == 0:
        raise ValueError(f"model: expected a QDQ model (QuantizeLinear / DequantizeLinear nodes, as `dcnkit quantize "
                         f"{name} -o OUT.onnx --calibration FEEDS.npz` writes), got {name} with none")
    return nq, ndq


def _symmetric_scale(scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    z = zero_point.astype(np.float64)
    return (scale.astype(np.float64) * np.maximum(z, 255.0 - z) / 127.0).astype(scale.dtype)


def _dequantized(x: np.ndarray, scale: np.ndarray, zero_point, axis: int) -> np.ndarray:
    """DequantizeLinear's value (per tensor, or per slice along ``axis``) in float32."""
    shape = [1] * x.ndim
    if scale.ndim == 1 and x.ndim > 0:
        shape[axis % x.ndim] = scale.size
    s = scale.astype(np.float64).reshape(shape if scale.size > 1 else [])
    z = 0 if zero_point is None else zero_point.astype(np.float64).reshape(s.shape)
    return ((x.astype(np.float64) - z) * s).astype(np.float32)


def tensorrt_qdq(proto, name: str = "the model"):
    """(a copy of ``proto`` in TensorRT's Q/DQ form, :class:`Int8Report`); see the module doc.
    ValueError for a model without Q/DQ nodes or with Q/DQ that TensorRT cannot take."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    model = onnx.ModelProto()
    model.CopyFrom(proto)
    g = model.graph
    nq, ndq = require_qdq(model, name)
    fused = [n.name or "(unnamed)" for n in g.node if n.op_type == "QDeformConv2d"]
    if fused:
        raise ValueError(f"model: expected the deformable convolutions float between Q/DQ (TensorRT's plugins take "
                         f"float), got {len(fused)} dcnkit::QDeformConv2d node(s), {fused[0]!r} first, an ONNX Runtime "
                         f"node: quantize for TensorRT with `dcnkit quantize {name} ... --no-qdeformconv`")
    report = Int8Report(quantize=nq, dequantize=ndq)
    inits = {t.name: t for t in g.initializer}

    def const(name, node, what):
        if name not in inits:
            raise ValueError(f"model: expected the {what} of {node.op_type} {node.name!r} to be a constant "
                             f"(an initializer), got the tensor {name!r}")
        return numpy_helper.to_array(inits[name])

    converted: dict = {}  # (scale, zero point) names -> (new scale, new zero point) names
    folded, clips = [], []
    for node in g.node:
        if node.op_type not in QDQ_OPS:
            continue
        if node.domain not in _ONNX_DOMAINS:
            raise ValueError(f"model: expected {node.op_type} {node.name!r} in the ONNX domain (TensorRT's parser), "
                             f"got the domain {node.domain!r}")
        scale_name = node.input[1]
        zp_name = node.input[2] if len(node.input) > 2 else ""
        scale = const(scale_name, node, "scale")
        zp = const(zp_name, node, "zero point") if zp_name else None
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
        if node.op_type == "DequantizeLinear" and node.input[0] in inits:
            x = numpy_helper.to_array(inits[node.input[0]])
            if x.dtype == np.int32:  # a bias: the float32 constant it stands for
                folded.append((node, numpy_helper.from_array(_dequantized(x, scale, zp, axis), node.output[0])))
                continue
        if zp is None or zp.dtype == np.uint8:  # no zero point: uint8 with zero point 0 (ONNX's default)
            z = np.zeros_like(scale, dtype=np.uint8) if zp is None else zp
            key = (scale_name, zp_name)
            if key not in converted:
                base = f"{scale_name}_int8sym"
                new_scale = _symmetric_scale(scale, z)
                g.initializer.append(numpy_helper.from_array(new_scale, base))
                g.initializer.append(numpy_helper.from_array(np.zeros(z.shape, np.int8), f"{base}_zero_point"))
                converted[key] = (base, f"{base}_zero_point")
                factor = float(np.max(new_scale.astype(np.float64) / np.maximum(scale, np.finfo(np.float32).tiny)))
                report.activations.append((scale_name, int(np.max(z)), factor))
            new_scale_name, new_zp_name = converted[key]
            if node.op_type == "QuantizeLinear":
                clips.append((node, scale, z))
            node.input[1] = new_scale_name
            if len(node.input) > 2:
                node.input[2] = new_zp_name
            else:
                node.input.append(new_zp_name)
        elif zp.dtype == np.int8:
            if np.any(zp != 0):
                raise ValueError(f"model: expected zero point 0 in {node.op_type} {node.name!r} (TensorRT quantizes "
                                 f"symmetrically), got {zp.ravel()[:4].tolist()}")
        else:
            raise ValueError(f"model: expected int8 or uint8 Q/DQ in {node.op_type} {node.name!r} (TensorRT's INT8), "
                             f"got {TensorProto.DataType.Name(helper.np_dtype_to_tensor_dtype(zp.dtype))}")
    for node, value in folded:
        g.node.remove(node)
        g.initializer.append(value)
    before = {id(node): _clip_node(g, node, scale, z) for node, scale, z in clips}
    nodes = [n for node in g.node for n in ((before[id(node)], node) if id(node) in before else (node,))]
    del g.node[:]
    g.node.extend(nodes)
    report.biases = len(folded)
    # Value infos of rewritten tensors would keep their uint8 / int32 types: drop them, shape inference redoes them.
    changed = {n.output[0] for n, _ in folded} | {o for n in g.node if n.op_type == "QuantizeLinear" for o in n.output}
    keep = [v for v in g.value_info if v.name not in changed]
    del g.value_info[:]
    g.value_info.extend(keep)
    _drop_unused_initializers(g)
    return model, report


def _clip_node(g, node, scale, zero_point):
    """The ``Clip(x, lo, hi)`` to go in front of ``node`` (a uint8 QuantizeLinear): the range it clipped to."""
    from onnx import helper, numpy_helper

    if scale.size != 1:
        raise ValueError(f"model: expected a per-tensor scale in the uint8 QuantizeLinear {node.name!r} (activations), "
                         f"got {scale.size} scales")
    s, z = float(scale.ravel()[0]), float(zero_point.ravel()[0])
    base = f"{node.name or node.output[0]}_uint8_range"
    g.initializer.append(numpy_helper.from_array(np.float32(-s * z), f"{base}_lo"))
    g.initializer.append(numpy_helper.from_array(np.float32(s * (255.0 - z)), f"{base}_hi"))
    clip = helper.make_node("Clip", [node.input[0], f"{base}_lo", f"{base}_hi"], [f"{base}_clipped"],
                            name=f"{base}_clip")
    node.input[0] = clip.output[0]
    return clip


def _drop_unused_initializers(g) -> None:
    used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
    keep = [t for t in g.initializer if t.name in used]
    del g.initializer[:]
    g.initializer.extend(keep)


def int8_build_setup(proto, strongly_typed: bool, version: str, say):
    """For ``build_engine_bytes(precision="int8")``: (the model in TensorRT's Q/DQ form, the Polygraphy
    ``CreateConfig`` flags). TensorRT 11 (strongly typed only) needs no flag: the Q/DQ nodes give the tensors their
    int8 type; TensorRT 10 gets ``BuilderFlag.INT8`` (explicit quantization: the Q/DQ nodes say where, no
    calibrator)."""
    proto, report = tensorrt_qdq(proto)
    say(f"int8: {report.summary()}")
    if strongly_typed:
        say(f"precision: TensorRT {version} builds strongly typed networks: --int8 needs no builder flag, the Q/DQ "
            "nodes set the int8 tensors (the kit's plugins run in float32 between them)")
        return proto, {}
    say(f"precision: TensorRT {version}: --int8 sets BuilderFlag.INT8 (explicit quantization from the Q/DQ nodes)")
    return proto, {"int8": True}


__all__ = ["Int8Report", "QDQ_OPS", "int8_build_setup", "qdq_counts", "require_qdq", "tensorrt_qdq"]
