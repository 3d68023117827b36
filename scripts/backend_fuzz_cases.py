"""The cases of scripts/backend_fuzz.py: random one-node ONNX models of every operator of the kit, under every name the
op table gives it (the kit's, mmdeploy's, mmcv's, TensorRT's, ONNX's own DeformConv) and ONNX's RoiAlign, with their
inputs. Most are valid; many are not: NaN, Inf and 1e12 in maps, offsets, locations and boxes; huge, inverted and
empty boxes; batch indices of -2, -1, N, NaN and 1e12; attributes out of range (sampling ratios of 2^30, kernels of
2^31 - 1, a NaN spatial scale, group counts that do not divide); level tables that lie (wrong sums, 2^31, 2^32 + 2);
empty tensors. Graph inputs are declared with static shapes (OpenVINO's static paths) or symbolic ones.

:func:`draw` (a NumPy Generator) -> :class:`Case`; the same generator state gives the same case.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INT32_EDGES = (2**31, 2**32 + 2, -(2**31) - 1)
BAD_BATCH = (-2.0, -1.0, "N", "N+3", np.nan, 1e12, -0.5)


@dataclass
class Case:
    """A one-node model (serialized ONNX), its feeds, and how to compare: ``ov_differs`` names a documented difference
    of OpenVINO's own operation (it then only has to end without a crash or a hang)."""
    name: str
    model: bytes
    feeds: dict
    ov_differs: str = ""
    samples_per_bin: int = 0  # of an explicit grid (sampling_ratio^2, sample_per_part^2); 0: adaptive or none


def _table():
    from dcnkit import op_defs

    return {op["name"]: op for op in op_defs()["ops"]}


class _Draw:
    """Random choices with a bias towards the edges."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng

    def p(self, prob: float) -> bool:
        return bool(self.rng.random() < prob)

    def int(self, lo: int, hi: int) -> int:
        return int(self.rng.integers(lo, hi + 1))

    def pick(self, seq):
        return seq[int(self.rng.integers(0, len(seq)))]

    def dim(self, lo: int, hi: int, empty: float = 0.04) -> int:
        """A size, now and then 0 (an empty tensor)."""
        return 0 if self.p(empty) else self.int(lo, hi)

    def data(self, shape, scale=None, poison: float = 0.25, finite: bool = False) -> np.ndarray:
        """float32 data, now and then with NaN, +-Inf and +-1e12 in it (``finite``: +-1e12 only)."""
        scale = scale if scale is not None else self.pick([1.0, 1.0, 1.0, 30.0])
        a = (self.rng.standard_normal(shape) * scale).astype(np.float32)
        if a.size and self.p(poison):
            for _ in range(self.int(1, 3)):
                a.flat[self.int(0, a.size - 1)] = self.pick([1e12, -1e12] if finite else
                                                            [np.nan, np.inf, -np.inf, 1e12, -1e12])
        return a

    def sampling_ratio(self) -> int:
        return self.pick([0, 0, 0, -1, 1, 2, 3, 5]) if not self.p(0.06) else self.pick([1024, 1025, 2**30])

    def scale(self) -> float:
        return self.pick([1.0, 0.5, 0.25, 0.0625]) if not self.p(0.04) else self.pick([np.nan, -1.0, 0.0, np.inf])

    def rois(self, k: int, n: int, h: int, w: int, scale: float, width: int = 5, huge: bool = True) -> np.ndarray:
        """k rows [batch, box...] in image coordinates (the map is h x w at `scale`): ordinary, edge and wild boxes."""
        s = scale if np.isfinite(scale) and scale > 0 else 1.0
        H, W = max(h, 1) / s, max(w, 1) / s
        rows = []
        for _ in range(k):
            b = float(self.int(0, max(n - 1, 0)))
            if self.p(0.06):
                bad = self.pick(BAD_BATCH)
                b = float(n) if bad == "N" else float(n + 3) if bad == "N+3" else float(bad)
            x1, y1 = self.rng.uniform(-0.3, 1.1) * W, self.rng.uniform(-0.3, 1.1) * H
            side = self.rng.uniform(0.2, 1.2) * max(H, W)
            kind = self.int(0, 11)
            if kind == 0 and huge:
                x1, y1, side = -self.pick([1e6, 1e12]), -self.pick([1e6, 1e12]), self.pick([2e6, 2e12])
            elif kind == 1:
                x1, y1 = x1 + 4 * W, y1 + 4 * H  # wholly outside
            elif kind == 2:
                side = -side  # inverted
            elif kind == 3:
                side = self.pick([0.0, 0.3])
            if width == 5:
                row = [b, x1, y1, x1 + side, y1 + side * self.rng.uniform(0.5, 1.5)]
            else:  # [batch, cx, cy, w, h, angle]
                row = [b, x1 + side / 2, y1 + side / 2, side, side * self.rng.uniform(0.5, 1.5),
                       self.rng.uniform(-4, 4)]
            if self.p(0.05):
                row[self.int(1, width - 1)] = self.pick([np.nan, np.inf, -np.inf])
            rows.append(row)
        return np.array(rows, np.float32).reshape(k, width)


# ------------------------------------------------------------------------------------------------
# Canonical inputs and attributes per operator (None: an absent optional input)


def _deform_conv2d(d: _Draw, standard: bool = False):
    """``standard`` (ONNX's DeformConv, which ONNX Runtime may run on its own kernel): no NaN / Inf in the input and
    the mask (that kernel multiplies the mask after sampling: a NaN mask of a sample off the map is NaN there, 0 in
    the kit), and now and then asymmetric pads [t, l, b, r] (more at the bottom and right)."""
    n, groups, dg = d.dim(1, 2), d.int(1, 2), d.int(1, 2)
    cin = groups * dg * d.int(1, 2)
    cout = groups * d.int(1, 3)
    kh, kw, stride, pad, dil = d.int(1, 3), d.int(1, 3), d.int(1, 2), d.int(0, 2), d.int(1, 2)
    h, w = d.int(1, 9), d.int(1, 9)
    extra = (d.int(0, 2), d.int(0, 2)) if standard and d.p(0.3) else (0, 0)

    def out_size(size, k, more):
        return (size + 2 * pad + more - (dil * (k - 1) + 1)) // stride + 1

    if out_size(h, kh, extra[0]) < 1 or out_size(w, kw, extra[1]) < 1:
        pad = max(kh, kw) * dil
    ho, wo = out_size(h, kh, extra[0]), out_size(w, kw, extra[1])
    inputs = [d.data((n, cin, h, w), finite=standard),
              d.data((n, 2 * dg * kh * kw, ho, wo), scale=d.pick([0.5, 3.0, 50.0])),
              d.data((cout, cin // groups, kh, kw), scale=0.5, poison=0.05, finite=standard),
              d.data((cout,), poison=0.05, finite=standard) if d.p(0.7) else None,
              d.data((n, dg * kh * kw, ho, wo), scale=1.0, finite=standard) if d.p(0.7) else None]
    padding = [pad, pad, pad + extra[0], pad + extra[1]] if extra != (0, 0) else [pad, pad]
    attrs = dict(stride=[stride, stride], padding=padding, dilation=[dil, dil], groups=groups, deformable_groups=dg)
    if d.p(0.1):  # (a padding of 2^31 - 1 would ask every backend for an output of 2^32 rows: not a fuzz case)
        attrs[d.pick(["stride", "dilation"])] = d.pick([[0, 1], [-1, 1], [2**31 - 1, 1]])
    if d.p(0.05):
        attrs["groups"] = d.pick([0, 3, 2**31 - 1])
    return inputs, attrs


def _roi_pool_map(d: _Draw):
    n, c, h, w = d.dim(1, 2), d.dim(1, 3), d.dim(1, 8), d.dim(1, 8)
    return n, c, h, w, d.data((n, c, h, w))


def _output_size(d: _Draw) -> list:
    """(oh, ow), now and then out of range (2^31 - 1 bins would be an output every backend spends minutes writing)."""
    return [d.int(1, 3), d.int(1, 3)] if not d.p(0.04) else d.pick([[0, 1], [1, -2], [-(2**31), 1]])


def _roi_align(d: _Draw):
    n, c, h, w, x = _roi_pool_map(d)
    scale = d.scale()
    rois = d.rois(d.dim(0, 4), n, h, w, scale)
    attrs = dict(output_size=_output_size(d), spatial_scale=scale, sampling_ratio=d.sampling_ratio(),
                 aligned=d.int(0, 1), pool_mode=d.pick(["avg", "max"]) if not d.p(0.03) else "middle")
    return [x, rois], attrs


def _deform_roi_pool(d: _Draw):
    n, c, h, w, x = _roi_pool_map(d)
    scale, size = d.scale(), _output_size(d)
    rois = d.rois(d.dim(0, 4), n, h, w, scale)
    shape = (rois.shape[0], 2, *size) if min(size) > 0 and max(size) < 64 else (rois.shape[0], 2, 1, 1)
    offset = d.data(shape, scale=d.pick([0.1, 1.0, 30.0])) if d.p(0.7) else None
    attrs = dict(output_size=size, spatial_scale=scale, sampling_ratio=d.sampling_ratio(),
                 gamma=d.pick([0.1, 0.0, 1.0]) if not d.p(0.03) else np.nan)
    return [x, rois, offset], attrs


def _deform_psroi_pool(d: _Draw):
    n, h, w = d.dim(1, 2), d.dim(1, 8), d.dim(1, 8)
    gs = d.int(1, 3)
    p = gs if d.p(0.6) else d.int(1, 4)  # output_size == group_size: the shape OpenVINO's own op took
    classes, per = d.int(1, 2), d.int(1, 2)
    dim = classes * per
    part = p if d.p(0.6) else d.int(1, 3)
    scale = d.scale()
    x = d.data((n, dim * gs * gs, h, w))
    rois = d.rois(d.dim(0, 4), n, h, w, scale)
    trans = d.data((rois.shape[0], 2 * classes, part, part), scale=d.pick([0.3, 3.0])) if d.p(0.7) else None
    spp = d.pick([1, 2, 4]) if not d.p(0.06) else d.pick([0, 1024, 1025, 2**30])
    attrs = dict(spatial_scale=scale, output_size=p, output_dim=dim if not d.p(0.04) else dim + 1,
                 group_size=gs, part_size=part if d.p(0.7) else 0, sample_per_part=spp,
                 trans_std=d.pick([0.1, 0.0, 1.0]), no_trans=int(trans is None))
    return [x, rois, trans], attrs


def _multi_level_roi_align(d: _Draw):
    n, c = d.dim(1, 2), d.dim(1, 3)
    levels = d.int(1, 3)
    strides = [float(4 * 2**i) for i in range(levels)]
    h, w = d.int(1, 8), d.int(1, 8)
    feats = [d.data((n, c, max(1, h // 2**i), max(1, w // 2**i))) for i in range(levels)]
    rois = d.rois(d.dim(0, 4), n, h, w, 0.25)
    if d.p(0.05):
        strides = d.pick([strides[:-1] or [0.0], [np.nan] * levels, [0.0] * levels])
    attrs = dict(output_size=_output_size(d), featmap_strides=strides, sampling_ratio=d.sampling_ratio(),
                 finest_scale=d.pick([4, 8, 56]) if not d.p(0.03) else 0,
                 roi_scale_factor=d.pick([1.0, 1.0, 1.5, 0.0, -1.0]), aligned=d.int(0, 1),
                 pool_mode=d.pick(["avg", "max"]))
    return [rois, feats], attrs


def _msda_tables(d: _Draw, levels: int):
    """(spatial_shapes, level_start_index, S): valid tables, now and then ones that lie."""
    shapes = np.array([[d.int(1, 4), d.int(1, 4)] for _ in range(levels)], np.int64)
    if d.p(0.08):
        shapes[d.int(0, levels - 1)] = [2**31, 0]  # a valid empty level past int32
    areas = shapes[:, 0] * shapes[:, 1]
    starts = np.concatenate([[0], np.cumsum(areas)[:-1]]).astype(np.int64)
    s = int(areas.sum())
    if d.p(0.12):
        bad = d.int(0, 3)
        lvl = d.int(0, levels - 1)
        if bad == 0:
            shapes[lvl, d.int(0, 1)] = d.pick(INT32_EDGES)
        elif bad == 1:
            starts[lvl] = d.pick([-1, s, 2**32 + starts[lvl], 2**31])
        elif bad == 2:
            shapes[lvl] = [-shapes[lvl, 0], shapes[lvl, 1]]
        else:
            s += 1  # sum of H*W != S
    return shapes, starts, s


def _multi_scale_deformable_attn(d: _Draw):
    n, m, dd, levels, points, lq = d.dim(1, 2), d.int(1, 2), d.int(1, 3), d.int(1, 3), d.int(1, 2), d.dim(1, 4)
    shapes, starts, s = _msda_tables(d, levels)
    loc = (d.rng.random((n, lq, m, levels, points, 2)) * 1.4 - 0.2).astype(np.float32)
    if loc.size and d.p(0.25):
        loc.flat[d.int(0, loc.size - 1)] = d.pick([np.nan, np.inf, -np.inf, 1e12])
    attn = d.data((n, lq, m, levels, points), poison=0.1)
    return [d.data((n, s, m, dd)), shapes, starts, loc, attn], {}


def _dcnv3_geometry(d: _Draw):
    kh, kw = d.pick([1, 3]), d.pick([1, 3])
    remove_center = int(kh * kw > 1 and d.p(0.2))
    attrs = dict(kernel_h=kh, kernel_w=kw, stride_h=d.int(1, 2), stride_w=d.int(1, 2), pad_h=kh // 2,
                 pad_w=kw // 2, dilation_h=1, dilation_w=1, group=d.int(1, 2), group_channels=d.int(1, 3),
                 offset_scale=d.pick([1.0, 0.5, 2.0]), remove_center=remove_center)
    n, h, w = d.dim(1, 2), d.int(1, 6), d.int(1, 6)
    if d.p(0.04):  # a kernel of 2^31 - 1 on an empty batch: shapes that pass, work that must not follow
        attrs.update(kernel_h=2**31 - 1, pad_h=2**30, remove_center=0)
        n = 0
    ho = (h + 2 * attrs["pad_h"] - (attrs["dilation_h"] * (attrs["kernel_h"] - 1) + 1)) // attrs["stride_h"] + 1
    wo = (w + 2 * attrs["pad_w"] - (attrs["dilation_w"] * (attrs["kernel_w"] - 1) + 1)) // attrs["stride_w"] + 1
    k = attrs["kernel_h"] * attrs["kernel_w"] - attrs["remove_center"]
    c = attrs["group"] * attrs["group_channels"]
    if d.p(0.05):
        attrs[d.pick(["group_channels", "stride_h", "kernel_w"])] = d.pick([0, -1, 2**31 - 1])
    return attrs, n, h, w, max(ho, 0), max(wo, 0), k, c


def _dcnv3(d: _Draw):
    attrs, n, h, w, ho, wo, k, c = _dcnv3_geometry(d)
    g = attrs["group"]
    offset_shape = (n, ho, wo, g * k * 2) if n else (0, ho, wo, g * k * 2)
    return [d.data((n, h, w, c)), np.zeros(offset_shape, np.float32) if n == 0 else d.data(offset_shape, 2.0),
            np.zeros((n, ho, wo, g * k), np.float32) if n == 0 else d.data((n, ho, wo, g * k))], attrs


def _dcnv4(d: _Draw):
    attrs, n, h, w, ho, wo, k, c = _dcnv3_geometry(d)
    attrs["softmax"] = d.int(0, 1)
    cp = -(-attrs["group"] * 3 * k // 8) * 8
    om = np.zeros((n, ho, wo, cp), np.float32) if n == 0 else d.data((n, ho, wo, cp), 2.0)
    return [d.data((n, h, w, c)), om], attrs


def _roi_align_rotated(d: _Draw):
    n, c, h, w, x = _roi_pool_map(d)
    scale = d.scale()
    rois = d.rois(d.dim(0, 4), n, h, w, scale, width=6)
    attrs = dict(output_size=_output_size(d), spatial_scale=scale, sampling_ratio=d.sampling_ratio(),
                 aligned=d.int(0, 1), clockwise=d.int(0, 1))
    return [x, rois], attrs


OPS = {"deform_conv2d": _deform_conv2d, "roi_align": _roi_align, "deform_roi_pool": _deform_roi_pool,
       "deform_psroi_pool": _deform_psroi_pool, "multi_level_roi_align": _multi_level_roi_align,
       "multi_scale_deformable_attn": _multi_scale_deformable_attn, "dcnv3": _dcnv3, "dcnv4": _dcnv4,
       "roi_align_rotated": _roi_align_rotated}


# ------------------------------------------------------------------------------------------------
# One node of a name of the op table, and ONNX's RoiAlign


def _value_info(d: _Draw, name: str, a: np.ndarray):
    from onnx import helper

    dims = list(a.shape)
    if d.p(0.3):  # symbolic dims: OpenVINO's dynamic-shape paths
        dims = [f"{name}_{i}" if d.p(0.6) else v for i, v in enumerate(dims)]
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), dims)


def _attribute(name: str, kind: str, value):
    from onnx import helper

    if kind == "float":
        value = float(value)
    elif kind == "floats":
        value = [float(v) for v in value]
    elif kind == "int" and not isinstance(value, float):
        value = int(value)
    elif kind == "ints":
        value = [int(v) for v in value]
    return helper.make_attribute(name, value)


def _variant_attributes(d: _Draw, op: dict, variant: dict, attrs: dict) -> list:
    kinds = {a["name"]: a["kind"] for a in op["attrs"]}
    if variant.get("onnx_standard") and len(attrs.get("padding", ())) == 2:  # ONNX DeformConv: pads [t, l, b, r]
        attrs = dict(attrs, padding=attrs["padding"] * 2)
    if not variant["attrs"]:
        return [_attribute(n, kinds[n], v) for n, v in attrs.items()]
    out = []
    for f in variant["attrs"]:
        v = attrs.get(f["canonical"])
        if v is None:
            continue
        if f["enum"]:
            names = f["enum"].split("|")
            v, kind = (names.index(v) if v in names else 7), "int"
        elif f["element"] >= 0:
            v, kind = v[f["element"]], "int"
        else:
            kind = kinds[f["canonical"]]
        out.append(_attribute(f["name"], kind, v))
    return out


def _mutate(d: _Draw, canonical: list, attrs: dict) -> None:
    """Now and then a malformed node: one tensor of another shape (a dim more, less, larger or 0), one attribute left
    out (its default) or written as a float."""
    tensors = [i for i, a in enumerate(canonical) if isinstance(a, np.ndarray)]
    if tensors and d.p(0.1):
        i = d.pick(tensors)
        shape = list(canonical[i].shape)
        how = d.int(0, 3)
        if how == 0 and shape:
            shape.pop(d.int(0, len(shape) - 1))
        elif how == 1:
            shape.insert(d.int(0, len(shape)), d.int(1, 2))
        elif shape:
            shape[d.int(0, len(shape) - 1)] = 0 if how == 2 else shape[0] + 1
        a = canonical[i]
        canonical[i] = (np.arange(int(np.prod(shape)), dtype=a.dtype).reshape(shape) if a.dtype == np.int64
                        else d.data(tuple(shape)))
    if attrs and d.p(0.08):
        name = d.pick(sorted(attrs))
        if d.p(0.5):
            del attrs[name]
        elif isinstance(attrs[name], int):
            attrs[name] = float(attrs[name])


def _variant_case(d: _Draw, op: dict, variant: dict) -> Case:
    from onnx import helper, numpy_helper

    make = OPS[op["name"]]
    canonical, attrs = make(d, standard=True) if variant.get("onnx_standard") else make(d)
    _mutate(d, canonical, attrs)
    names = [t["name"] for t in op["inputs"]]
    graph_inputs, initializers, node_inputs, feeds = [], [], [], {}
    for slot in variant["inputs"]:
        value = canonical[slot["canonical"]]
        tensors = value if slot["variadic"] else [value]
        for j, a in enumerate(tensors):
            if a is None:
                node_inputs.append("")
                continue
            name = names[slot["canonical"]] + (f"_{j}" if slot["variadic"] else "")
            node_inputs.append(name)
            if a.dtype == np.int64 and d.p(0.5):  # a level table as a constant of the model
                initializers.append(numpy_helper.from_array(a, name))
            else:
                graph_inputs.append(_value_info(d, name, a))
                feeds[name] = a
    while node_inputs and node_inputs[-1] == "":
        node_inputs.pop()
    outputs = ["y", "count"] if op["name"] == "deform_psroi_pool" and d.p(0.3) else ["y"]
    node = helper.make_node(variant["op_type"], node_inputs, outputs, name="n", domain=variant["domain"])
    node.attribute.extend(_variant_attributes(d, op, variant, attrs))
    graph = helper.make_graph([node], "fuzz", graph_inputs,
                              [helper.make_tensor_value_info(o, helper.np_dtype_to_tensor_dtype(np.dtype(np.float32)),
                                                             None) for o in outputs], initializer=initializers)
    opsets = [helper.make_opsetid("", 19 if variant.get("onnx_standard") else 17)]
    if variant["domain"]:
        opsets.append(helper.make_opsetid(variant["domain"], 1))
    model = helper.make_model(graph, opset_imports=opsets, ir_version=9)
    grid = max(int(attrs.get("sampling_ratio", 0)), int(attrs.get("sample_per_part", 0)), 0)
    return Case(f"{variant['domain'] or 'ai.onnx'}::{variant['op_type']}", model.SerializeToString(), feeds,
                samples_per_bin=grid * grid if grid <= 1024 else 0)


def _onnx_roi_align_case(d: _Draw) -> Case:
    """ONNX's RoiAlign (opset 10 or 16; float32, float16 or float64), with what ONNX Runtime's own kernel, the oracle,
    can take: no huge box and no huge sampling ratio (it has no bounded work), finite maps (it reads pixel (0, 0)
    with weight 0 for a sample off the map, and OpenVINO converts a float64 input's Inf to 3.4e38)."""
    from onnx import helper

    dtype = d.pick([np.float32, np.float32, np.float32, np.float16, np.float64])
    opset = d.pick([10, 16])
    # Maps of at least one row and column in float16: ONNX Runtime 1.2x's float16 RoiAlign crashes on an empty one.
    n, c = d.dim(1, 2), d.dim(1, 3)
    h, w = (d.int(1, 8), d.int(1, 8)) if dtype == np.float16 else (d.dim(1, 8), d.dim(1, 8))
    x = d.data((n, c, h, w), finite=True)
    x = (np.clip(x, -3e4, 3e4) if dtype == np.float16 else x).astype(dtype)  # float16 tops out at 65504
    scale = d.pick([1.0, 0.5, 0.25])
    rows = d.rois(d.dim(0, 4), n, h, w, scale, huge=False)
    batch = np.nan_to_num(rows[:, 0], nan=-1.0).astype(np.int64)
    rois = rows[:, 1:].astype(dtype)
    mode = "max" if d.p(0.12) else "avg"
    attrs = dict(output_height=d.int(1, 3), output_width=d.int(1, 3), spatial_scale=scale,
                 sampling_ratio=d.pick([0, 0, 1, 2, 3]), mode=mode)
    if opset >= 16 and d.p(0.6):
        attrs["coordinate_transformation_mode"] = d.pick(["half_pixel", "output_half_pixel"])
    feeds = {"X": x, "rois": rois, "batch_indices": batch}
    node = helper.make_node("RoiAlign", list(feeds), ["y"], name="n", **attrs)
    graph = helper.make_graph([node], "fuzz", [_value_info(d, k, v) for k, v in feeds.items()],
                              [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                                                             None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)
    # OpenVINO's ROIAlign-9 takes the largest interpolated sample; ONNX's max is the largest weighted corner value
    differs = "max RoiAlign: OpenVINO's ROIAlign-9 computes another function" if mode == "max" else ""
    return Case(f"ai.onnx::RoiAlign-{opset} {np.dtype(dtype).name}", model.SerializeToString(), feeds, differs)


def variants() -> list:
    """(op, variant) for every name of every operator that ONNX files may hold (TensorRT-only names left out)."""
    return [(op, v) for op in _table().values() for v in op["variants"] if not v["tensorrt_only"]]


def draw(rng: np.random.Generator, names: list | None = None) -> Case:
    """One case: an operator (each as likely as ONNX's RoiAlign), one of its names, its inputs and attributes.
    ``names``: :func:`variants` (read once by the caller)."""
    d = _Draw(rng)
    by_op: dict = {}
    for op, v in names if names is not None else variants():
        by_op.setdefault(op["name"], (op, []))[1].append(v)
    ops = sorted(by_op)
    i = d.int(0, len(ops))  # one more: ONNX's RoiAlign
    if i == len(ops):
        return _onnx_roi_align_case(d)
    op, vs = by_op[ops[i]]
    return _variant_case(d, op, d.pick(vs))
