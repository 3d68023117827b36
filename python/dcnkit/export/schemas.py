"""ONNX schemas of the ``dcnkit`` domain, built from the op table, with type and shape inference.

After ``register_onnx_schemas()``, ``onnx.checker.check_model(model, full_check=True)`` and
``onnx.shape_inference.infer_shapes(model, strict_mode=True)`` accept our nodes and infer their
outputs: element type of the features (``rois`` have a type of their own, R: float32 RoIs may go with float16 /
bfloat16 features, as the plugins take them); shapes ``(N, Cout, Ho, Wo)`` for DeformConv2d, ``(K, C, oh, ow)``
for RoIAlign / DeformRoIPool / MultiLevelRoIAlign (whose inputs are ``rois, feat_0 .. feat_{L-1}``, a
variadic last input), ``(K, output_dim, P, P)`` for DeformPSRoIPool and ``(N, Lq, M*D)`` for
MultiScaleDeformableAttention (int64 level tables), ``(N, Ho, Wo, C)`` for DCNv3 / DCNv4 (channels last),
symbolic dims kept.
onnx >= 1.18 runs a Python inference function set with
``OpSchema.set_type_and_shape_inference_function`` (also in strict mode); inconsistent inputs raise
with the core's message format (``<op>: <arg>: expected <x>, got <y>``).
"""
from __future__ import annotations

import threading
from typing import Any

from dcnkit.export import _table

_TYPES = ["tensor(float)", "tensor(float16)", "tensor(double)", "tensor(bfloat16)"]
_lock = threading.Lock()
_registered = False


class _Dim:
    """A dimension as known to shape inference: an int, a symbol (str) or unknown (None)."""

    @staticmethod
    def read(d: Any) -> int | str | None:
        if d.HasField("dim_value"):
            return int(d.dim_value)
        if d.HasField("dim_param"):
            return d.dim_param
        return None

    @staticmethod
    def write(proto_dim: Any, value: int | str | None) -> None:
        if isinstance(value, int):
            proto_dim.dim_value = value
        elif isinstance(value, str):
            proto_dim.dim_param = value


def _shape(ctx: Any, i: int) -> list[int | str | None] | None:
    """Input i's dims, or None when absent or of unknown rank."""
    if i >= ctx.get_num_inputs() or not ctx.has_input(i):
        return None
    t = ctx.get_input_type(i)
    if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
        return None
    return [_Dim.read(d) for d in t.tensor_type.shape.dim]


def _fail(op: str, arg: str, expected: Any, got: Any) -> None:
    import onnx.shape_inference
    raise onnx.shape_inference.InferenceError(f"{op}: {arg}: expected {expected}, got {got}")


def _check_rank(op: str, arg: str, shape: list | None, rank: int) -> None:
    if shape is not None and len(shape) != rank:
        _fail(op, arg, f"rank {rank}", f"rank {len(shape)}")


def _check_dim(op: str, arg: str, got: int | str | None, expected: int | None) -> None:
    if isinstance(got, int) and expected is not None and got != expected:
        _fail(op, arg, expected, got)


def _attrs(ctx: Any, info: _table.OpInfo) -> dict[str, Any]:
    import onnx

    out = info.defaults()
    for a in info.attrs:
        proto = ctx.get_attribute(a.name)
        if proto is not None:
            value = onnx.helper.get_attribute_value(proto)
            out[a.name] = a.convert(value.decode() if isinstance(value, bytes) else value)
    return out


def _conv_out(size: int | str | None, k: int | str | None, s: int, p: int, d: int) -> int | None:
    if isinstance(size, int) and isinstance(k, int):
        return (size + 2 * p - (d * (k - 1) + 1)) // s + 1
    return None


def _infer_deform_conv2d(info, ctx, attrs):
    op = info.onnx_type
    x, offset, w = _shape(ctx, 0), _shape(ctx, 1), _shape(ctx, 2)
    bias = _shape(ctx, 3)
    mask = _shape(ctx, 4)
    for arg, s in (("input", x), ("offset", offset), ("weight", w), ("mask", mask)):
        _check_rank(op, arg, s, 4)
    _check_rank(op, "bias", bias, 1)
    for a in ("stride", "dilation"):
        if len(attrs[a]) != 2 or min(attrs[a]) < 1:
            _fail(op, a, "2 values >= 1", attrs[a])
    if len(attrs["padding"]) != 2 or min(attrs["padding"]) < 0:
        _fail(op, "padding", "2 values >= 0", attrs["padding"])
    groups, dg = attrs["groups"], attrs["deformable_groups"]
    if groups < 1:
        _fail(op, "groups", ">= 1", groups)
    if dg < 1:
        _fail(op, "deformable_groups", ">= 1", dg)
    (sh, sw), (ph, pw), (dh, dw) = attrs["stride"], attrs["padding"], attrs["dilation"]
    n = x[0] if x else (offset[0] if offset else None)
    cout = w[0] if w else None
    kh, kw = (w[2], w[3]) if w else (None, None)
    ho = _conv_out(x[2], kh, sh, ph, dh) if x else None
    wo = _conv_out(x[3], kw, sw, pw, dw) if x else None
    if x and w and isinstance(x[1], int) and isinstance(w[1], int):
        _check_dim(op, "weight.shape[1]", w[1], x[1] // groups if x[1] % groups == 0 else None)
        if x[1] % groups:
            _fail(op, "groups", f"a divisor of Cin={x[1]}", groups)
        if x[1] % dg:
            _fail(op, "deformable_groups", f"a divisor of Cin={x[1]}", dg)
    if isinstance(cout, int) and cout % groups:
        _fail(op, "groups", f"a divisor of Cout={cout}", groups)
    if bias:
        _check_dim(op, "bias.shape[0]", bias[0], cout if isinstance(cout, int) else None)
    if offset:
        kk = kh * kw if isinstance(kh, int) and isinstance(kw, int) else None
        _check_dim(op, "offset.shape[1]", offset[1], 2 * dg * kk if kk else None)
        _check_dim(op, "offset.shape[2]", offset[2], ho)
        _check_dim(op, "offset.shape[3]", offset[3], wo)
        # Sizes unknown from input and weight (symbolic H, W) are the offset's.
        ho = ho if ho is not None else offset[2]
        wo = wo if wo is not None else offset[3]
    if mask:
        kk = kh * kw if isinstance(kh, int) and isinstance(kw, int) else None
        _check_dim(op, "mask.shape[1]", mask[1], dg * kk if kk else None)
    if isinstance(ho, int) and (ho < 1 or (isinstance(wo, int) and wo < 1)):
        _fail(op, "input", "a spatial size giving an output of at least 1x1", f"{ho}x{wo}")
    return [[n, cout, ho, wo]]


def _check_rois(op: str, rois: list | None) -> int | str | None:
    _check_rank(op, "rois", rois, 2)
    if rois:
        _check_dim(op, "rois.shape[1]", rois[1], 5)
        return rois[0]
    return None


def _output_size(op: str, attrs: dict[str, Any]) -> tuple[int, int]:
    size = attrs["output_size"]
    if len(size) != 2 or min(size) < 1:
        _fail(op, "output_size", "2 values >= 1", size)
    return int(size[0]), int(size[1])


def _infer_roi_align(info, ctx, attrs):
    op = info.onnx_type
    x = _shape(ctx, 0)
    _check_rank(op, "input", x, 4)
    k = _check_rois(op, _shape(ctx, 1))
    oh, ow = _output_size(op, attrs)
    if attrs["pool_mode"] not in ("avg", "max"):
        _fail(op, "pool_mode", "avg or max", repr(attrs["pool_mode"]))
    return [[k, x[1] if x else None, oh, ow]]


def _infer_deform_roi_pool(info, ctx, attrs):
    op = info.onnx_type
    x = _shape(ctx, 0)
    _check_rank(op, "input", x, 4)
    k = _check_rois(op, _shape(ctx, 1))
    oh, ow = _output_size(op, attrs)
    offset = _shape(ctx, 2)
    _check_rank(op, "offset", offset, 4)
    if offset:
        _check_dim(op, "offset.shape[1]", offset[1], 2)
        _check_dim(op, "offset.shape[2]", offset[2], oh)
        _check_dim(op, "offset.shape[3]", offset[3], ow)
        k = k if k is not None else offset[0]
    return [[k, x[1] if x else None, oh, ow]]


def _infer_deform_psroi_pool(info, ctx, attrs):
    op = info.onnx_type
    x = _shape(ctx, 0)
    _check_rank(op, "input", x, 4)
    k = _check_rois(op, _shape(ctx, 1))
    p, od, gs = attrs["output_size"], attrs["output_dim"], attrs["group_size"]
    for a, v in (("output_size", p), ("output_dim", od), ("group_size", gs)):
        if v < 1:
            _fail(op, a, ">= 1", v)
    if x:
        _check_dim(op, "input.shape[1]", x[1], od * gs * gs)
    trans = _shape(ctx, 2)
    _check_rank(op, "trans", trans, 4)
    has_trans = ctx.get_num_inputs() > 2 and ctx.has_input(2)
    if attrs["no_trans"] and has_trans:
        _fail(op, "trans", "absent when no_trans=1", "an input")
    if trans:
        part = attrs["part_size"] if attrs["part_size"] > 0 else p
        _check_dim(op, "trans.shape[2]", trans[2], part)
        _check_dim(op, "trans.shape[3]", trans[3], part)
        k = k if k is not None else trans[0]
    return [[k, od, p, p]] * len(info.outputs)


def _infer_multi_level_roi_align(info, ctx, attrs):
    op = info.onnx_type
    k = _check_rois(op, _shape(ctx, 0))
    oh, ow = _output_size(op, attrs)
    if attrs["pool_mode"] not in ("avg", "max"):
        _fail(op, "pool_mode", "avg or max", repr(attrs["pool_mode"]))
    levels = ctx.get_num_inputs() - 1
    strides = attrs["featmap_strides"]
    if levels < 1:
        _fail(op, "inputs", "rois and at least one feature map", f"{levels + 1} inputs")
    if len(strides) != levels:
        _fail(op, "featmap_strides", f"one stride per feature map ({levels} values)", strides)
    if any(not (s > 0) for s in strides):
        _fail(op, "featmap_strides", "strides > 0", strides)
    if attrs["finest_scale"] < 1:
        _fail(op, "finest_scale", "an int > 0", attrs["finest_scale"])
    channels = None
    batch = None
    for i in range(levels):
        x = _shape(ctx, 1 + i)
        _check_rank(op, f"feat_{i}", x, 4)
        if not x:
            continue
        if isinstance(x[1], int) and isinstance(channels, int) and x[1] != channels:
            _fail(op, f"feat_{i}.shape[1]", f"{channels} (the channels of the other maps)", x[1])
        if isinstance(x[0], int) and isinstance(batch, int) and x[0] != batch:
            _fail(op, f"feat_{i}.shape[0]", f"{batch} (the batch size of the other maps)", x[0])
        channels = channels if channels is not None else x[1]
        batch = batch if batch is not None else x[0]
    return [[k, channels, oh, ow]]


def _infer_msda(info, ctx, attrs):
    """(N, Lq, M*D) from value (N, S, M, D) and sampling_locations (N, Lq, M, L, P, 2)."""
    op = info.onnx_type
    value, shapes, starts = _shape(ctx, 0), _shape(ctx, 1), _shape(ctx, 2)
    loc, weights = _shape(ctx, 3), _shape(ctx, 4)
    for arg, shape, rank in (("value", value, 4), ("spatial_shapes", shapes, 2), ("level_start_index", starts, 1),
                             ("sampling_locations", loc, 6), ("attention_weights", weights, 5)):
        _check_rank(op, arg, shape, rank)
    known = lambda v: v if isinstance(v, int) else None  # noqa: E731
    n, m, d = (value[0], value[2], value[3]) if value else (None, None, None)
    levels = shapes[0] if shapes else None
    if shapes:
        _check_dim(op, "spatial_shapes.shape[1]", shapes[1], 2)
    if starts:
        _check_dim(op, "level_start_index.shape[0]", starts[0], known(levels))
    lq = weights[1] if weights else None
    if loc:
        for i, want in ((0, n), (2, m), (3, levels), (5, 2)):
            _check_dim(op, f"sampling_locations.shape[{i}]", loc[i], known(want))
        if weights:
            for i in range(5):
                _check_dim(op, f"attention_weights.shape[{i}]", weights[i], known(loc[i]))
        n = n if known(n) is not None else loc[0]
        m = m if known(m) is not None else loc[2]
        lq = loc[1]
    md = m * d if known(m) is not None and known(d) is not None else None
    return [[n, lq, md]]


def _infer_dcnv3(info, ctx, attrs):
    """(N, Ho, Wo, C) from input (N, H, W, C), channels last; DCNv3's offset (N, Ho, Wo, G*K*2) and mask
    (N, Ho, Wo, G*K), DCNv4's offset_mask (N, Ho, Wo, Cp) with Cp = G*3K rounded up to a multiple of 8."""
    op = info.onnx_type
    names = [t.name for t in info.inputs]
    x = _shape(ctx, 0)
    sites = [(n, _shape(ctx, i)) for i, n in enumerate(names) if i > 0]
    _check_rank(op, names[0], x, 4)
    for n, s in sites:
        _check_rank(op, n, s, 4)
    for a in ("kernel_h", "kernel_w", "stride_h", "stride_w", "dilation_h", "dilation_w", "group", "group_channels"):
        if attrs[a] < 1:
            _fail(op, a, "an int >= 1", attrs[a])
    for a in ("pad_h", "pad_w"):
        if attrs[a] < 0:
            _fail(op, a, "an int >= 0", attrs[a])
    g, gc = attrs["group"], attrs["group_channels"]
    k = attrs["kernel_h"] * attrs["kernel_w"] - (1 if attrs["remove_center"] else 0)
    want = {"offset": g * k * 2, "mask": g * k, "offset_mask": (g * 3 * k + 7) // 8 * 8}
    n = x[0] if x else None
    ho = _conv_out(x[1], attrs["kernel_h"], attrs["stride_h"], attrs["pad_h"], attrs["dilation_h"]) if x else None
    wo = _conv_out(x[2], attrs["kernel_w"], attrs["stride_w"], attrs["pad_w"], attrs["dilation_w"]) if x else None
    if x:
        _check_dim(op, f"{names[0]}.shape[3]", x[3], g * gc)
    for name, s in sites:
        if not s:
            continue
        _check_dim(op, f"{name}.shape[0]", s[0], n if isinstance(n, int) else None)
        _check_dim(op, f"{name}.shape[1]", s[1], ho)
        _check_dim(op, f"{name}.shape[2]", s[2], wo)
        _check_dim(op, f"{name}.shape[3]", s[3], want[name])
        # Sizes unknown from the input (symbolic H, W) are the offsets'.
        n = n if n is not None else s[0]
        ho = ho if ho is not None else s[1]
        wo = wo if wo is not None else s[2]
    if isinstance(ho, int) and (ho < 1 or (isinstance(wo, int) and wo < 1)):
        _fail(op, names[0], "a spatial size giving an output of at least 1x1", f"{ho}x{wo}")
    return [[n, ho, wo, g * gc]]


def _infer_declared(info, ctx, attrs):
    """Output dims from the op's declaration in the C++ core (dcnkit.op_output_dims): every op without a function
    above. With every input dim known the core checks the node (its messages); otherwise the op's output rule runs
    on the dims there are, symbolic ones kept."""
    from dcnkit import _lib

    inputs = [_shape(ctx, i) if i < ctx.get_num_inputs() else None for i in range(len(info.inputs))]
    variadic = []
    if info.inputs and info.inputs[-1].variadic:
        first = len(info.inputs) - 1
        variadic = [_shape(ctx, i) or [] for i in range(first, ctx.get_num_inputs())]
    values = []
    for a in info.attrs:
        v = attrs[a.name]
        values.append(list(v) if isinstance(v, (list, tuple)) else v)
    try:
        shapes = _lib.op_output_dims(info.onnx_type, values, inputs, variadic)
    except ValueError as e:
        import onnx.shape_inference
        raise onnx.shape_inference.InferenceError(str(e)) from None
    return shapes or []


# The ops whose inference is written here (their tests check these messages); every other op's comes from its
# declaration (_infer_declared).
_INFER = {
    "deform_conv2d": _infer_deform_conv2d,
    "roi_align": _infer_roi_align,
    "deform_roi_pool": _infer_deform_roi_pool,
    "deform_psroi_pool": _infer_deform_psroi_pool,
    "multi_level_roi_align": _infer_multi_level_roi_align,
    "multi_scale_deformable_attn": _infer_msda,
    "dcnv3": _infer_dcnv3,
    "dcnv4": _infer_dcnv3,
}


def _make_inference(info: _table.OpInfo):
    import onnx

    first_t = [_type_param(t) for t in info.inputs].index("T")

    def infer(ctx: Any) -> None:
        shapes = _INFER.get(info.name, _infer_declared)(info, ctx, _attrs(ctx, info))
        elem = 0
        # The element type of the first T input (the features: MultiLevelRoIAlign's come after its RoIs).
        t0 = ctx.get_input_type(first_t)
        if t0 is not None and t0.HasField("tensor_type"):
            elem = t0.tensor_type.elem_type
        for i, dims in enumerate(shapes):
            if i >= ctx.get_num_outputs() or not ctx.has_output(i):
                continue
            tp = onnx.TypeProto()
            tp.tensor_type.elem_type = elem
            shape = tp.tensor_type.shape
            for d in dims:
                _Dim.write(shape.dim.add(), d)
            ctx.set_output_type(i, tp)

    return infer


def _type_param(t: _table.TensorInfo) -> str:
    """I: int64 level tables; R: RoIs (float32 RoIs may go with float16 / bfloat16 features); T: the rest."""
    return "I" if t.int64 else "R" if t.rois else "T"


def _build_schema(info: _table.OpInfo) -> Any:
    import onnx
    from onnx.defs import OpSchema

    def option(t):
        if t.variadic:
            return OpSchema.FormalParameterOption.Variadic
        return OpSchema.FormalParameterOption.Optional if t.optional else OpSchema.FormalParameterOption.Single

    def params(tensors):
        return [
            OpSchema.FormalParameter(t.name, _type_param(t), t.doc, param_option=option(t),
                                     is_homogeneous=True, min_arity=1)
            for t in tensors
        ]

    constraints = [("T", _TYPES, "floating-point tensors")]
    if any(_type_param(t) == "R" for t in info.inputs):
        constraints.append(("R", _TYPES, "RoIs: the features' type, or float32 with 16-bit features"))
    if any(t.int64 for t in info.inputs):
        constraints.append(("I", ["tensor(int64)"], "index tensors"))

    attributes = [
        OpSchema.Attribute(a.name, OpSchema.AttrType.FLOATS, a.doc, required=True)
        if a.required
        else OpSchema.Attribute(a.name, onnx.helper.make_attribute(a.name, a.default), a.doc)
        for a in info.attrs
    ]
    # TensorRT's ONNX parser finds the plugin of a node by these (they are not plugin fields).
    plugin = {"plugin_namespace": _table.domain(), "plugin_version": _table.PLUGIN_VERSION}
    attributes += [
        OpSchema.Attribute(k, onnx.helper.make_attribute(k, v), f"TensorRT plugin {k.split('_')[1]} ({v!r})")
        for k, v in plugin.items()
    ]
    schema = OpSchema(
        info.onnx_type,
        _table.domain(),
        _table.opset(),
        f"dcnkit {info.name} (see docs/operators.md). Inputs and attributes from the dcnkit op table.",
        inputs=params(info.inputs),
        outputs=params(info.outputs),
        type_constraints=constraints,
        attributes=attributes,
    )
    schema.set_type_and_shape_inference_function(_make_inference(info))
    return schema


def register_onnx_schemas() -> None:
    """Registers the ``dcnkit`` domain's schemas with onnx (idempotent, process-wide)."""
    global _registered
    if _registered:
        return
    with _lock:
        if _registered:
            return
        import onnx.defs

        for info in _table.ops().values():
            try:
                onnx.defs.get_schema(info.onnx_type, _table.opset(), _table.domain())
            except onnx.defs.SchemaError:
                onnx.defs.register_schema(_build_schema(info))
        _registered = True
