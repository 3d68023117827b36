"""Shape inference that knows the kit's operators, for the quantizer's pre-processing
(:mod:`dcnkit.runtime.quantize_prep`).

ONNX Runtime's symbolic shape inference (``onnxruntime.tools.symbolic_shape_infer``, the first step of its
``quant_pre_process``) computes symbolic shapes and the values of shape arithmetic (Shape -> Gather -> Div ...), but
stops at a node of a custom domain. :func:`infer_shapes` runs it with the kit's shape rules added to its dispatcher
(the operator contract, docs/operators.md), for every name the kit's ONNX Runtime library runs:

- deformable convolutions (``dcnkit::DeformConv2d``, ``dcnkit::QDeformConv2d``, standard ``DeformConv``, mmdeploy's
  and mmcv's ``MMCV(Modulated)DeformConv2d``): ``(N, Cout, Ho, Wo)`` = (input's N, weight's Cout, the offsets'
  ``Ho, Wo``);
- DCNv3 / DCNv4 (channels last): ``(N, Ho, Wo, C)``;
- RoI poolings: ``(K, C, oh, ow)`` from the RoIs, the features and the output size attribute(s);
- multi-scale deformable attention: ``(N, Lq, M*D)`` (TensorRT's plugin name: ``(N, Lq, M, D)``).

:func:`shape_values` then gives the shape computations whose values are known numbers (independent of any dynamic
dimension), which the pre-processing writes as initializers.
"""
from __future__ import annotations

import numpy as np

__all__ = ["infer_shapes", "shape_values", "KIT_SHAPE_RULES"]


def _deform(x, w, off):
    return lambda s, a: [s(x)[0], s(w)[0], s(off)[2], s(off)[3]]


def _roi(rois, feat, size_attrs):
    def rule(s, a):
        if len(size_attrs) == 1:
            size = a.get(size_attrs[0], [1, 1])
            oh, ow = (size[0], size[-1]) if isinstance(size, (list, tuple)) else (size, size)
        else:
            oh, ow = a.get(size_attrs[0], 1), a.get(size_attrs[1], 1)
        return [s(rois)[0], s(feat)[1], int(oh), int(ow)]

    return rule


def _psroi(s, a):
    size = a.get("output_size", 7)
    p = size[0] if isinstance(size, (list, tuple)) else size
    return [s(1)[0], int(a.get("output_dim", 1)), int(p), int(p)]


def _channels_last(s, a):
    return [s(0)[0], s(1)[1], s(1)[2], s(0)[3]]


def _msda(per_head):
    def rule(s, a):
        v, loc = s(0), s(3)
        return [v[0], loc[1], v[2], v[3]] if per_head else [v[0], loc[1], v[2] * v[3]]

    return rule


# (domain, op type) -> (rule(shape_of, attrs) -> output dims, index of the input whose element type the output has)
KIT_SHAPE_RULES = {
    ("dcnkit", "DeformConv2d"): (_deform(0, 2, 1), 0),
    ("dcnkit", "QDeformConv2d"): (_deform(0, 3, 6), 0),
    ("", "DeformConv"): (_deform(0, 1, 2), 0),
    ("ai.onnx", "DeformConv"): (_deform(0, 1, 2), 0),
    ("dcnkit", "RoIAlign"): (_roi(1, 0, ("output_size",)), 0),
    ("dcnkit", "DeformRoIPool"): (_roi(1, 0, ("output_size",)), 0),
    ("dcnkit", "DeformPSRoIPool"): (_psroi, 0),
    ("dcnkit", "MultiLevelRoIAlign"): (_roi(0, 1, ("output_size",)), 1),
    ("mmcv", "MMCVRoiAlign"): (_roi(1, 0, ("output_height", "output_width")), 0),
    ("mmcv", "MMCVDeformRoIPool"): (_roi(1, 0, ("pooled_height", "pooled_width")), 0),
    ("mmdeploy", "MMCVMultiLevelRoiAlign"): (_roi(0, 1, ("output_height", "output_width")), 1),
    ("dcnkit", "DCNv3"): (_channels_last, 0),
    ("dcnkit", "DCNv4"): (_channels_last, 0),
    ("mmdeploy", "TRTDCNv3"): (_channels_last, 0),
    ("dcnkit", "MultiScaleDeformableAttention"): (_msda(False), 0),
}
for _d in ("mmdeploy", "mmcv"):
    KIT_SHAPE_RULES[(_d, "MMCVModulatedDeformConv2d")] = (_deform(0, 3, 1), 0)
    KIT_SHAPE_RULES[(_d, "MMCVDeformConv2d")] = (_deform(0, 2, 1), 0)
    KIT_SHAPE_RULES[(_d, "MMCVMultiScaleDeformableAttention")] = (_msda(False), 0)
for _d in ("nvidia", "trt", "TRT"):
    KIT_SHAPE_RULES[(_d, "MultiscaleDeformableAttnPlugin_TRT")] = (_msda(True), 0)


def _inference_class():
    """ONNX Runtime's SymbolicShapeInference with the kit's rules in its dispatcher (keyed by op type; a node of
    another domain with the same op type keeps ONNX Runtime's handling)."""
    from onnx import helper
    from onnxruntime.tools import symbolic_shape_infer as ssi

    class KitShapeInference(ssi.SymbolicShapeInference):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            for op_type in {t for _, t in KIT_SHAPE_RULES}:
                self.dispatcher_[op_type] = self._kit_rule(self.dispatcher_.get(op_type))

        def _kit_rule(self, fallback):
            def infer(node):
                entry = KIT_SHAPE_RULES.get((node.domain, node.op_type))
                if entry is None:
                    if fallback is not None:
                        fallback(node)
                    return
                rule, type_input = entry
                attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
                dims = rule(lambda i: self._get_sympy_shape(node, i), attrs)
                self._update_computed_dims(dims)
                elem = self.known_vi_[node.input[type_input]].type.tensor_type.elem_type
                vi = self.known_vi_[node.output[0]]
                vi.CopyFrom(helper.make_tensor_value_info(node.output[0], elem, ssi.get_shape_from_sympy_shape(dims)))

            return infer

    return KitShapeInference


def infer_shapes(proto):
    """``(model with value_info, the inference object)`` for ``proto`` (an ``onnx.ModelProto``, not changed).

    Runs ONNX Runtime's symbolic shape inference with the kit's rules (dynamic dimensions merged where they must
    be equal). Raises ImportError where onnxruntime's tool or sympy is missing, RuntimeError where the inference
    stops (the message names the node)."""
    cls = _inference_class()
    inference = cls(2**31 - 1, True, False, 0)
    inference._preprocess(proto)
    done = False
    while inference.run_:
        done = inference._infer_impl()
    inference._update_output_from_vi()
    if not done:
        def unknown(o):
            t = inference.known_vi_[o].type.tensor_type if o in inference.known_vi_ else None
            return t is None or not t.elem_type or not t.HasField("shape")

        stuck = [n for n in inference.out_mp_.graph.node if any(unknown(o) for o in n.output if o)]
        where = f"{stuck[0].domain or 'ai.onnx'}::{stuck[0].op_type} '{stuck[0].name}'" if stuck else "a node"
        raise RuntimeError(f"it stopped at {where}")
    return inference.out_mp_, inference


# Shape arithmetic whose known values are written as initializers (their outputs are small integer tensors).
_SHAPE_OPS = {"Shape", "Size", "Gather", "Slice", "Concat", "Unsqueeze", "Squeeze", "Add", "Sub", "Mul", "Div",
              "Neg", "Cast", "Identity", "Reshape", "Range", "Floor", "Ceil", "Max", "Min"}


def shape_values(model, inference) -> dict:
    """Tensor name -> numpy value, for the outputs of shape arithmetic (``Shape``, ``Gather``, ``Div`` ...) whose
    value :func:`infer_shapes` computed as plain integers (no dynamic dimension in it)."""
    from onnx import helper

    vi = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    out = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx") or node.op_type not in _SHAPE_OPS:
            continue
        for name in node.output:
            value = inference.sympy_data_.get(name)
            info = vi.get(name)
            if value is None or info is None or not info.type.tensor_type.HasField("shape"):
                continue
            flat = np.asarray(value if isinstance(value, (list, tuple)) else [value], dtype=object).ravel()
            if not all(_is_integer(v) for v in flat):  # a dynamic dimension in it
                continue
            ints = [int(v) for v in flat]
            dims = [d.dim_value if d.HasField("dim_value") else None for d in info.type.tensor_type.shape.dim]
            if None in dims or int(np.prod(dims)) != len(ints):
                continue
            elem = info.type.tensor_type.elem_type
            dtype = helper.tensor_dtype_to_np_dtype(elem) if elem else np.int64
            if not np.issubdtype(dtype, np.integer):
                continue
            out[name] = np.asarray(ints, dtype=dtype).reshape(dims)
    return out


def _is_integer(v) -> bool:
    if isinstance(v, (bool, np.bool_)):
        return False
    if isinstance(v, (int, np.integer)):
        return True
    return bool(getattr(v, "is_Integer", False))
