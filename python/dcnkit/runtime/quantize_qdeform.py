"""The quantized DeformConv2d in a QDQ model: where :func:`dcnkit.runtime.quantize.quantize` leaves a deformable
convolution float between a DequantizeLinear and a QuantizeLinear, :func:`fuse_qdeform_conv` writes one
``dcnkit::QDeformConv2d`` node instead (docs/operators.md): 8-bit input and output, int8 weights per output
channel, float offsets and mask. Its CPU kernel (the kit's ONNX Runtime library, oneDNN's int8 GEMM) samples the
8-bit input once per sampling point and channel and multiplies 8-bit columns.

The pattern, for every deformable convolution the kit runs (``dcnkit::DeformConv2d``, mmdeploy / mmcv names,
standard ``DeformConv``)::

    DequantizeLinear(x_q, x_scale, x_zp) -> DeformConv -> [Relu] -> [MaxPool, Reshape, ...] -> QuantizeLinear(y)

each tensor used once, with a per-tensor x and y quantization of one 8-bit type. A Relu is folded where y's zero
point is its type's minimum (the output's saturation is the Relu then); shape nodes and MaxPool between run on the
8-bit output instead (quantization commutes with them). Elsewhere the node stays float. The weight is a float
initializer (ONNX Runtime's tool
does not quantize the kit's nodes), quantized here symmetrically per output channel (7-bit with ``reduce_range``,
as the tool's own weights), or an int8 initializer behind a DequantizeLinear with zero zero points.
"""
from __future__ import annotations

import functools

import numpy as np

__all__ = ["fuse_qdeform_conv", "qdeform_available", "quantize_weight_per_channel", "QDEFORM_OP", "DEFORM_INPUTS"]

QDEFORM_OP = ("dcnkit", "QDeformConv2d")

# domain, op type -> positions of input, offset, weight, bias, mask; and how to read its attributes
DEFORM_INPUTS = {
    ("dcnkit", "DeformConv2d"): (0, 1, 2, 3, 4),
    ("", "DeformConv"): (0, 2, 1, 3, 4), ("ai.onnx", "DeformConv"): (0, 2, 1, 3, 4),
    ("mmdeploy", "MMCVModulatedDeformConv2d"): (0, 1, 3, 4, 2), ("mmcv", "MMCVModulatedDeformConv2d"): (0, 1, 3, 4, 2),
    ("mmdeploy", "MMCVDeformConv2d"): (0, 1, 2, None, None), ("mmcv", "MMCVDeformConv2d"): (0, 1, 2, None, None),
}


def _pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return [int(v[0]), int(v[-1])]


def _kit_attrs(node) -> dict | None:
    """The node's attributes as dcnkit::DeformConv2d's (stride, padding, dilation, groups, deformable_groups), or
    None where they cannot be (asymmetric padding)."""
    from onnx import helper

    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    if node.op_type == "DeformConv":
        pads = list(a.get("pads", [0, 0, 0, 0]))
        if pads[:2] != pads[2:]:
            return None
        return dict(stride=_pair(a.get("strides", [1, 1])), padding=pads[:2],
                    dilation=_pair(a.get("dilations", [1, 1])), groups=int(a.get("group", 1)),
                    deformable_groups=int(a.get("offset_group", 1)))
    if node.domain == "dcnkit":
        return dict(stride=_pair(a.get("stride", [1, 1])), padding=_pair(a.get("padding", [0, 0])),
                    dilation=_pair(a.get("dilation", [1, 1])), groups=int(a.get("groups", 1)),
                    deformable_groups=int(a.get("deformable_groups", 1)))
    pad = a.get("padding", 0)
    pad = list(pad) if isinstance(pad, (list, tuple)) else [pad]
    if len(pad) == 4 and pad[:2] != pad[2:]:
        return None
    return dict(stride=_pair(a.get("stride", 1)), padding=_pair(pad[:2] if len(pad) == 4 else pad),
                dilation=_pair(a.get("dilation", 1)), groups=int(a.get("groups", 1)),
                deformable_groups=int(a.get("deform_groups", a.get("deformable_groups", 1))))


def quantize_weight_per_channel(w: np.ndarray, reduce_range: bool):
    """Symmetric int8 per output channel: (int8 weight, float32 scales)."""
    qmax = 63 if reduce_range else 127
    amax = np.abs(w.reshape(w.shape[0], -1)).max(1).astype(np.float64)
    scale = np.where(amax > 0, amax / qmax, 1.0)
    q = np.clip(np.rint(w / scale.reshape(-1, 1, 1, 1)), -qmax, qmax).astype(np.int8)
    return q, scale.astype(np.float32)


# Nodes between the convolution and its QuantizeLinear that the 8-bit output can go through unchanged.
_COMMUTING = {"MaxPool", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Identity"}


def _output_chain(node, consumers, graph_outputs):
    """From the convolution's output, each tensor read by exactly one node and none a graph output: an optional
    Relu, then nodes of ``_COMMUTING``, then a QuantizeLinear. Returns (relu, chain, quantize) or (.., .., None)."""
    relu, chain, t = None, [], node.output[0]
    while True:
        users = consumers.get(t, [])
        if len(users) != 1 or t in graph_outputs:
            return relu, chain, None
        u = users[0]
        if u.op_type == "QuantizeLinear":
            return relu, chain, u
        if u.op_type == "Relu" and relu is None and not chain:
            relu = u
        elif u.op_type in _COMMUTING and len(u.output) == 1:
            chain.append(u)
        else:
            return relu, chain, None
        t = u.output[0]


def fuse_qdeform_conv(proto, reduce_range: bool = True) -> int:
    """Rewrites every DequantizeLinear -> deformable convolution -> QuantizeLinear of ``proto`` (an
    ``onnx.ModelProto``, changed in place) into one ``dcnkit::QDeformConv2d``; returns how many."""
    import onnx
    from onnx import helper, numpy_helper

    g = proto.graph
    nodes = list(g.node)  # every node object below comes from this one list (removal is by identity)
    init = {t.name: t for t in g.initializer}
    producer = {o: n for n in nodes for o in n.output}
    consumers: dict[str, list] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    graph_outputs = {o.name for o in g.output}

    def const(name):
        return numpy_helper.to_array(init[name]) if name in init else None

    def scalar_q(node):  # (scale name, zero-point name) of a per-tensor Q/DQ with constant params, else None
        if len(node.input) < 3 or const(node.input[1]) is None or const(node.input[2]) is None:
            return None
        if const(node.input[1]).size != 1 or const(node.input[2]).dtype not in (np.uint8, np.int8):
            return None
        return node.input[1], node.input[2]

    fused, remove, before, new_inits, stale = 0, set(), {}, [], set()
    for node in nodes:
        pos = DEFORM_INPUTS.get((node.domain, node.op_type))
        if pos is None:
            continue
        ii, io, iw, ib, im = pos
        get = lambda i: node.input[i] if i is not None and i < len(node.input) and node.input[i] else None  # noqa
        dq = producer.get(get(ii))
        if dq is None or dq.op_type != "DequantizeLinear" or node.output[0] in graph_outputs:
            continue
        relu, chain, q = _output_chain(node, consumers, graph_outputs)
        if q is None:
            continue
        xq, yq = scalar_q(dq), scalar_q(q)
        attrs = _kit_attrs(node)
        if xq is None or yq is None or attrs is None or const(xq[1]).dtype != const(yq[1]).dtype:
            continue
        if relu is not None and int(const(yq[1])) != np.iinfo(const(yq[1]).dtype).min:
            continue  # the Relu is the output's saturation only where the zero point is the type's minimum
        wname, w_dq = get(iw), producer.get(get(iw))
        if wname in init and const(wname).dtype == np.float32 and const(wname).ndim == 4:
            wq, ws = quantize_weight_per_channel(const(wname), reduce_range)
        elif (w_dq is not None and w_dq.op_type == "DequantizeLinear" and const(w_dq.input[0]) is not None
              and const(w_dq.input[0]).dtype == np.int8 and const(w_dq.input[1]) is not None
              and (len(w_dq.input) < 3 or not np.any(const(w_dq.input[2])))):
            wq = const(w_dq.input[0])
            ws = np.broadcast_to(const(w_dq.input[1]).astype(np.float32).reshape(-1), (wq.shape[0],)).copy()
        else:
            continue
        base = node.name or f"qdeform_{fused}"
        names = {k: f"{base}.q.{k}" for k in ("w", "w_scale", "w_zp")}
        new_inits += [numpy_helper.from_array(wq, names["w"]), numpy_helper.from_array(ws, names["w_scale"]),
                      numpy_helper.from_array(np.zeros(wq.shape[0], np.int8), names["w_zp"])]
        inputs = [dq.input[0], xq[0], xq[1], names["w"], names["w_scale"], names["w_zp"], get(io),
                  get(im) or "", get(ib) or "", yq[0], yq[1]]
        # QDeformConv2d writes the Q's output, or (a shape / max chain between) the chain's first input; the
        # chain then runs on the 8-bit values (they commute with a monotonic per-tensor quantization).
        out_name = q.output[0] if not chain else f"{base}.q.y"
        fusedn = helper.make_node(QDEFORM_OP[1], inputs, [out_name], name=f"{base}_quant", domain=QDEFORM_OP[0],
                                  **attrs)
        if chain:
            stale.update(c.output[0] for c in chain)  # their float value_info
            chain[0].input[0] = out_name
            chain[-1].output[0] = q.output[0]
        before[id(node)] = fusedn
        remove.update(id(n) for n in (node, q, relu) if n is not None)
        for d in (dq, w_dq):  # DequantizeLinear nodes read by nothing else now
            if d is not None and len(consumers.get(d.output[0], [])) == 1 and d.output[0] not in graph_outputs:
                remove.add(id(d))
        fused += 1
    if not fused:
        return 0
    keep = []
    for n in nodes:
        if id(n) in before:
            keep.append(before[id(n)])
        if id(n) not in remove:
            keep.append(onnx.NodeProto())
            keep[-1].CopyFrom(n)
    del g.node[:]
    g.node.extend(keep)
    vi = [v for v in g.value_info if v.name not in stale]
    del g.value_info[:]
    g.value_info.extend(vi)
    g.initializer.extend(new_inits)
    # initializers nobody reads any more (the float weights)
    used = {i for n in g.node for i in n.input} | graph_outputs
    dead = [t for t in g.initializer if t.name not in used]
    for t in dead:
        g.initializer.remove(t)
    if not any(o.domain == QDEFORM_OP[0] for o in proto.opset_import):
        proto.opset_import.append(helper.make_opsetid(QDEFORM_OP[0], 1))
    return fused


@functools.lru_cache(maxsize=None)
def qdeform_available() -> bool:
    """Whether the kit's ONNX Runtime library here runs ``dcnkit::QDeformConv2d`` (it has the op and finds
    oneDNN): one tiny node is run."""
    from onnx import TensorProto, helper, numpy_helper

    from dcnkit.runtime.ort import ort_session

    c = {"x_scale": np.float32(0.1), "x_zp": np.uint8(0), "w": np.ones((1, 1, 1, 1), np.int8),
         "w_scale": np.ones(1, np.float32), "w_zp": np.zeros(1, np.int8), "off": np.zeros((1, 2, 1, 1), np.float32),
         "y_scale": np.float32(0.1), "y_zp": np.uint8(0)}
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in c.items()]
    node = helper.make_node("QDeformConv2d", ["x", "x_scale", "x_zp", "w", "w_scale", "w_zp", "off", "", "",
                                              "y_scale", "y_zp"], ["y"], domain="dcnkit")
    graph = helper.make_graph([node], "probe", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 1, 1, 1])],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("dcnkit", 1)],
                              ir_version=10)
    try:
        s = ort_session(model.SerializeToString(), providers=["CPUExecutionProvider"], intra_op_num_threads=1)
        y = s.run(None, {"x": np.full((1, 1, 1, 1), 7, np.uint8)})[0]
    except Exception:  # noqa: BLE001 - no op or no oneDNN: not available
        return False
    return int(y.ravel()[0]) == 7
