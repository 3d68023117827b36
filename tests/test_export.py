"""ONNX export of dcnkit's operators: torch vs ONNX Runtime parity, both exporters, standard and
custom modes, dynamic batch and RoI count, checker and strict shape inference, to_onnx errors.

Tolerance (fp32): |onnx - torch| <= 1e-5 * |torch| + 1e-6 (1e-5 relative; the absolute term only
covers values that are zero up to rounding). Every model is exported at batch 2 / 3 RoIs and run at
batch 3 / 5 RoIs (and 1 / 1 for the per-op models).
"""
from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

import dcnkit  # noqa: E402
import dcnkit.export  # noqa: E402
from dcnkit import ops  # noqa: E402

RTOL, ATOL = 1e-5, 1e-6
EXPORTERS = [pytest.param(True, id="dynamo"), pytest.param(False, id="torchscript")]
MODES = [pytest.param(True, id="standard"), pytest.param(False, id="custom")]
DOMAIN = "dcnkit"

_spec = importlib.util.spec_from_file_location(
    "dcnkit_export_samples", Path(__file__).resolve().parents[1] / "export" / "samples.py"
)
samples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(samples)


def _rois(k, n, size, g):
    return samples.random_rois(k, n, size, size, g)


# ---- one small model per operator (several attribute sets each) ------------------------------


class DeformConvOps(torch.nn.Module):
    """DCNv2 (mask, bias, groups 2, deformable groups 2) and DCNv1 (no mask, no bias, stride 2,
    dilation 2)."""

    def __init__(self):
        super().__init__()
        self.w2 = torch.nn.Parameter(torch.randn(6, 2, 3, 3) * 0.3)
        self.b2 = torch.nn.Parameter(torch.randn(6))
        self.w1 = torch.nn.Parameter(torch.randn(5, 4, 3, 3) * 0.3)

    def forward(self, x, offset2, mask2, offset1):
        v2 = ops.deform_conv2d(x, offset2, self.w2, self.b2, padding=1, mask=mask2)
        v1 = ops.deform_conv2d(x, offset1, self.w1, None, stride=2, padding=(2, 1), dilation=(2, 1))
        return v2, v1

    @staticmethod
    def inputs(n, k, g):
        x = torch.randn(n, 4, 9, 9, generator=g)
        # Offsets up to ~3 pixels: many taps fall partly or fully outside the map.
        off2 = torch.randn(n, 2 * 2 * 9, 9, 9, generator=g) * 1.5
        mask2 = torch.rand(n, 2 * 9, 9, 9, generator=g)
        off1 = torch.randn(n, 18, 5, 5, generator=g) * 1.5  # Ho = (9 + 4 - 5) // 2 + 1, Wo = (9 + 2 - 3) // 2 + 1
        return x, off2, mask2, off1


class RoIAlignOps(torch.nn.Module):
    def forward(self, x, rois):
        return (
            ops.roi_align(x, rois, (3, 2), 0.5, sampling_ratio=2, aligned=True),
            ops.roi_align(x, rois, 2, 0.5, sampling_ratio=0, aligned=False),  # min-size-1 rule
            ops.roi_align(x, rois, 2, 0.5, sampling_ratio=-1, aligned=True),  # adaptive, negative ratio
            ops.roi_align(x, rois, 2, 0.5, sampling_ratio=2, aligned=False, pool_mode="max"),
        )

    @staticmethod
    def inputs(n, k, g):
        return torch.randn(n, 3, 8, 8, generator=g), _rois(k, n, 16, g)


class DeformRoIPoolOps(torch.nn.Module):
    def forward(self, x, rois, offset):
        return (
            ops.deform_roi_pool(x, rois, offset, 3, 0.5, 2, 0.1),
            ops.deform_roi_pool(x, rois, None, (2, 3), 0.5, 0, 0.1),
        )

    @staticmethod
    def inputs(n, k, g):
        return torch.randn(n, 3, 8, 8, generator=g), _rois(k, n, 16, g), torch.randn(k, 2, 3, 3, generator=g)


class DeformPSRoIPoolOps(torch.nn.Module):
    def forward(self, x, rois, trans):
        return (
            ops.deform_psroi_pool(x, rois, trans, 0.5, 3, 2, 3, part_size=3, sample_per_part=2, trans_std=0.1),
            ops.deform_psroi_pool(x, rois, None, 0.5, 2, 2, 3, sample_per_part=3),
        )

    @staticmethod
    def inputs(n, k, g):
        return (
            torch.randn(n, 2 * 3 * 3, 8, 8, generator=g),
            _rois(k, n, 16, g),
            torch.randn(k, 2 * 2, 3, 3, generator=g),  # 2 classes
        )


class MultiLevelRoIAlignOps(torch.nn.Module):
    """Three maps of a 16 x 16 image (strides 2, 4, 8); finest_scale 4 puts the RoIs on every level."""

    def forward(self, rois, f0, f1, f2):
        return (
            ops.multi_level_roi_align([f0, f1, f2], rois, (3, 2), [2.0, 4.0, 8.0], 2, finest_scale=4),
            ops.multi_level_roi_align([f0, f1, f2], rois, 2, [2.0, 4.0, 8.0], 0, 4, 1.5, False, "max"),
        )

    @staticmethod
    def inputs(n, k, g):
        maps = [torch.randn(n, 3, 16 // s, 16 // s, generator=g) for s in (2, 4, 8)]
        return (_rois(k, n, 16, g), *maps)


class RoIAlignRotatedOps(torch.nn.Module):
    """roi_align_rotated (issue 38's operator), aligned and not, clockwise, explicit and adaptive grids."""

    def forward(self, x, rois):
        return (
            ops.roi_align_rotated(x, rois, (3, 2), 0.5, 2, True, False),
            ops.roi_align_rotated(x, rois, 2, 0.5, 0, False, True),
        )

    @staticmethod
    def inputs(n, k, g):
        boxes = _rois(k, n, 16, g)
        centres = (boxes[:, 1:3] + boxes[:, 3:5]) / 2
        sizes = boxes[:, 3:5] - boxes[:, 1:3]
        angles = torch.rand(k, 1, generator=g) * 6 - 3
        return torch.randn(n, 3, 8, 8, generator=g), torch.cat([boxes[:, :1], centres, sizes, angles], 1)


class MsdaOps(torch.nn.Module):
    """multi_scale_deformable_attn on two levels (4 x 4 and 2 x 2), 2 heads of 3 channels, k queries."""

    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return ops.multi_scale_deformable_attn(value, spatial_shapes, level_start_index, sampling_locations,
                                               attention_weights)

    @staticmethod
    def inputs(n, k, g):
        return (torch.randn(n, 20, 2, 3, generator=g), torch.tensor([[4, 4], [2, 2]]), torch.tensor([0, 16]),
                torch.rand(n, k, 2, 2, 2, 2, generator=g), torch.rand(n, k, 2, 2, 2, generator=g))


class Dcnv3Ops(torch.nn.Module):
    """dcnv3 (3x3, 2 groups of 4 channels, k x 5 map) and dcnv4 with softmax on the same sampling."""

    def forward(self, x, offset, mask, offset_mask):
        attrs = (3, 3, 1, 1, 1, 1, 1, 1, 2, 4, 0.5)
        return ops.dcnv3(x, offset, mask, *attrs), ops.dcnv4(x, offset_mask, *attrs, softmax=True)

    @staticmethod
    def inputs(n, k, g):
        return (torch.randn(n, k, 5, 8, generator=g), torch.randn(n, k, 5, 36, generator=g),
                torch.rand(n, k, 5, 18, generator=g), torch.randn(n, k, 5, 56, generator=g))


OP_MODELS = {
    "deform_conv2d": (DeformConvOps, {"DeformConv"}, {"DeformConv2d"}),
    "roi_align": (RoIAlignOps, {"RoiAlign"}, {"RoIAlign"}),
    "deform_roi_pool": (DeformRoIPoolOps, set(), {"DeformRoIPool"}),
    "deform_psroi_pool": (DeformPSRoIPoolOps, set(), {"DeformPSRoIPool"}),
    "multi_level_roi_align": (MultiLevelRoIAlignOps, set(), {"MultiLevelRoIAlign"}),
    "roi_align_rotated": (RoIAlignRotatedOps, set(), {"RoIAlignRotated"}),
}


# ---- helpers ----------------------------------------------------------------------------------


def _session(path, model_proto):
    """Plain ONNX Runtime when the graph has only standard ops, else the kit's session."""
    if any(n.domain == DOMAIN for n in model_proto.graph.node):
        from dcnkit.runtime import ort_session

        return ort_session(str(path), providers=["CPUExecutionProvider"])
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _assert_close(ref, got, what):
    ref = ref.detach().numpy()
    assert ref.shape == got.shape, f"{what}: shape {got.shape} != torch {ref.shape}"
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=what)


def _run_parity(model, make_inputs, path, sizes):
    proto = onnx.load(str(path))
    sess = _session(path, proto)
    for n, k in sizes:
        ins = make_inputs(n, k, torch.Generator().manual_seed(100 + 7 * n + k))
        with torch.no_grad():
            ref = model(*ins)
        ref = ref if isinstance(ref, tuple) else (ref,)
        got = sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), ins)})
        assert len(got) == len(ref)
        for j, (r, o) in enumerate(zip(ref, got)):
            _assert_close(r, o, f"{path.name}: output {j} at batch {n}, {k} RoIs")
    return proto


def _node_types(proto):
    return {(n.domain or "", n.op_type) for n in proto.graph.node}


def _dims(value_info):
    return [d.dim_param if d.HasField("dim_param") else (d.dim_value if d.HasField("dim_value") else None)
            for d in value_info.type.tensor_type.shape.dim]


# ---- parity per operator ------------------------------------------------------------------------


@pytest.mark.parametrize("standard", MODES)
@pytest.mark.parametrize("dynamo", EXPORTERS)
@pytest.mark.parametrize("op_name", list(OP_MODELS))
def test_op_parity(op_name, dynamo, standard, tmp_path):
    cls, std_types, custom_types = OP_MODELS[op_name]
    model = cls().eval()
    path = tmp_path / f"{op_name}.onnx"
    dcnkit.export.to_onnx(model, cls.inputs(2, 3, torch.Generator().manual_seed(1)), path,
                          dynamo=dynamo, standard_ops=standard)
    proto = _run_parity(model, cls.inputs, path, [(3, 5), (1, 1), (2, 3)])

    types = _node_types(proto)
    ours = {t for d, t in types if d == DOMAIN}
    std = {t for d, t in types if d == ""}
    if standard:
        assert std_types <= std, f"expected standard {std_types} in {types}"
        # max-mode roi_align has no identical standard op: it stays ours.
        expected_ours = (custom_types - {"DeformConv2d", "RoIAlign"}) | ({"RoIAlign"} if op_name == "roi_align" else set())
        assert ours == expected_ours
    else:
        assert ours == custom_types and not (std & {"DeformConv", "RoiAlign"})
    if ours:
        assert any(o.domain == DOMAIN and o.version == 1 for o in proto.opset_import)

    # Strict shape inference on the exported file: outputs keep the dynamic axes.
    inferred = dcnkit.export.check_model(path)
    rank4 = [_dims(o) for o in inferred.graph.output]
    lead = "batch" if op_name == "deform_conv2d" else "num_rois"
    assert all(d[0] == lead and len(d) == 4 for d in rank4), rank4
    assert all(isinstance(x, int) for d in rank4 for x in d[1:]), rank4


def test_custom_nodes_follow_op_table(tmp_path):
    """Input order and attribute names of our nodes come from dcnkit.op_defs()."""
    table = {d["onnx_type"]: d for d in dcnkit.op_defs()["ops"]}
    seen = set()
    # (MsdaOps, Dcnv3Ops: not in OP_MODELS, whose parity test expects RoI-shaped outputs.)
    extra = [("msda", MsdaOps), ("dcnv3", Dcnv3Ops)]
    for op_name, cls in [(name, c) for name, (c, _, _) in OP_MODELS.items()] + extra:
        path = tmp_path / f"{op_name}.onnx"
        dcnkit.export.to_onnx(cls().eval(), cls.inputs(2, 3, torch.Generator().manual_seed(1)), path,
                              standard_ops=False, dynamo=False, check=False)
        for node in onnx.load(str(path)).graph.node:
            if node.domain != DOMAIN:
                continue
            d = table[node.op_type]
            seen.add(node.op_type)
            assert sorted(a.name for a in node.attribute) == sorted([a["name"] for a in d["attrs"]] + ["plugin_namespace"])
            # TensorRT's ONNX parser finds the kit's plugin creators by this namespace.
            assert onnx.helper.get_attribute_value(
                next(a for a in node.attribute if a.name == "plugin_namespace")) == DOMAIN.encode()
            assert all(node.input), "no empty inner input (TensorRT passes plugin inputs by position)"
            if d["inputs"][-1].get("variadic"):  # one node input per tensor of the variadic last input
                assert len(node.input) >= len(d["inputs"]) and len(node.output) == len(d["outputs"])
            else:
                assert len(node.input) <= len(d["inputs"]) and len(node.output) == len(d["outputs"])
    assert seen == set(table)


def test_standard_ops_match_torchvision(tmp_path):
    """The standard-op graphs also agree with torchvision (the compatibility references of docs/operators.md)."""
    tv = pytest.importorskip("torchvision")
    g = torch.Generator().manual_seed(5)
    x, off2, mask2, off1 = DeformConvOps.inputs(3, 0, g)
    m = DeformConvOps().eval()
    path = tmp_path / "dcn.onnx"
    dcnkit.export.to_onnx(m, DeformConvOps.inputs(2, 3, g), path)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.numpy(), "offset2": off2.numpy(), "mask2": mask2.numpy(), "offset1": off1.numpy()})
    with torch.no_grad():
        ref2 = tv.ops.deform_conv2d(x, off2, m.w2, m.b2, padding=1, mask=mask2)
        ref1 = tv.ops.deform_conv2d(x, off1, m.w1, None, stride=2, padding=(2, 1), dilation=(2, 1))
    _assert_close(ref2, got[0], "DeformConv vs torchvision (v2)")
    _assert_close(ref1, got[1], "DeformConv vs torchvision (v1)")

    x, rois = RoIAlignOps.inputs(3, 6, g)
    path = tmp_path / "roi.onnx"
    dcnkit.export.to_onnx(RoIAlignOps().eval(), RoIAlignOps.inputs(2, 3, g), path)
    got = _session(path, onnx.load(str(path))).run(None, {"x": x.numpy(), "rois": rois.numpy()})
    _assert_close(tv.ops.roi_align(x, rois, (3, 2), 0.5, 2, True), got[0], "RoiAlign vs torchvision (aligned)")
    _assert_close(tv.ops.roi_align(x, rois, 2, 0.5, 0, False), got[1], "RoiAlign vs torchvision (not aligned)")


# ---- sample models ------------------------------------------------------------------------------


@pytest.mark.parametrize("standard", MODES)
@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_combined_model_parity(dynamo, standard, tmp_path):
    model = samples.build("combined")
    path = tmp_path / "combined.onnx"
    dcnkit.export.to_onnx(model, samples.sample_inputs("combined"), path, dynamo=dynamo, standard_ops=standard)

    def make(n, k, g):
        return samples.sample_inputs("combined", batch=n, num_rois=k, seed=int(torch.randint(0, 1000, (1,), generator=g)))

    proto = _run_parity(model, make, path, [(3, 5), (1, 2)])
    ours = {n.op_type for n in proto.graph.node if n.domain == DOMAIN}
    if standard:
        assert ours == {"RoIAlign", "DeformRoIPool", "DeformPSRoIPool"}
        assert {"DeformConv", "RoiAlign"} <= {n.op_type for n in proto.graph.node if n.domain == ""}
    else:
        assert ours == {"DeformConv2d", "RoIAlign", "DeformRoIPool", "DeformPSRoIPool"}
    inferred = dcnkit.export.check_model(path)
    assert [_dims(o) for o in inferred.graph.output] == [["num_rois", 5], ["num_rois", 3]]


@pytest.mark.parametrize("dynamo", EXPORTERS)
def test_plain_torch_onnx_export(dynamo, tmp_path):
    """After ``import dcnkit``, plain torch.onnx.export handles the ops (no custom table, no to_onnx)."""
    model = samples.build("block")
    (x,) = samples.sample_inputs("block")
    path = tmp_path / "plain.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=["x"], output_names=["y"],
                          **({} if dynamo else {"opset_version": 20}))
    proto = onnx.load(str(path))
    assert ("", "DeformConv") in _node_types(proto)
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    with torch.no_grad():
        _assert_close(model(x), got, "plain export")

    # The switch for "every op as a dcnkit node".
    with dcnkit.export.custom_ops_only():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), str(path), dynamo=dynamo, input_names=["x"],
                              **({} if dynamo else {"opset_version": 20}))
    assert (DOMAIN, "DeformConv2d") in _node_types(onnx.load(str(path)))
    assert dcnkit.export.standard_ops_enabled()


def test_opset_18_falls_back_to_custom_deform_conv(tmp_path):
    model = samples.build("block")
    path = tmp_path / "o18.onnx"
    with pytest.warns(UserWarning, match="opset_version 18 < 19"):
        dcnkit.export.to_onnx(model, samples.sample_inputs("block"), path, opset_version=18, dynamo=False)
    proto = _run_parity(model, lambda n, k, g: (torch.randn(n, 8, 12, 12, generator=g),), path, [(3, 0)])
    assert (DOMAIN, "DeformConv2d") in _node_types(proto)
    assert ("", "DeformConv") not in _node_types(proto)


class _MaskNoBias(torch.nn.Module):
    """DCNv2 with a mask and no bias: the bias slot before the mask gets zeros (the neutral value)."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 3, 3, 3) * 0.3)

    def forward(self, x, offset, mask):
        return ops.deform_conv2d(x, offset, self.w, None, padding=1, mask=mask)


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_plain_torchscript_export_below_opset_15_has_no_castlike(opset, tmp_path):
    """The zero bias filled in for an absent bias before a present mask uses only ops of the file's opset."""
    g = torch.Generator().manual_seed(opset)
    model = _MaskNoBias()
    x, off, m = torch.randn(1, 3, 7, 7, generator=g), torch.randn(1, 18, 7, 7, generator=g), \
        torch.rand(1, 9, 7, 7, generator=g)
    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x, off, m), str(path), dynamo=False, opset_version=opset,
                          input_names=["x", "offset", "mask"])
    proto = onnx.load(str(path))
    onnx.checker.check_model(proto, full_check=True)
    assert "CastLike" not in {n.op_type for n in proto.graph.node}
    node = next(n for n in proto.graph.node if n.domain == DOMAIN)
    assert node.input[3] != "" and len(node.input) == 5
    from dcnkit.runtime import ort_session
    sess = ort_session(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {"x": x.numpy(), "offset": off.numpy(), "mask": m.numpy()})[0]
    with torch.no_grad():
        _assert_close(model(x, off, m), got, f"opset {opset}")


# ---- to_onnx argument checks ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(model="not a module"), TypeError, "to_onnx: model: expected a torch.nn.Module, got str"),
        (dict(args=[1.0]), TypeError, "to_onnx: args[0]: expected a torch.Tensor, got float"),
        (dict(args=()), TypeError, "to_onnx: args: expected a tensor or a non-empty tuple of tensors, got an empty tuple"),
        (dict(path=3), TypeError, "to_onnx: path: expected a str or os.PathLike, got int"),
        (dict(path="/nonexistent-dir/m.onnx"), ValueError, "to_onnx: path: expected a file in an existing folder"),
        (dict(standard_ops="yes"), TypeError, "to_onnx: standard_ops: expected a bool, got str"),
        (dict(dynamic_batch=1), TypeError, "to_onnx: dynamic_batch: expected a bool, got int"),
        (dict(opset_version=17), ValueError, "to_onnx: opset_version: expected 18..23 (the dynamo exporter), got 17"),
        (dict(opset_version=21, dynamo=False), ValueError,
         "to_onnx: opset_version: expected 18..20 (the TorchScript exporter), got 21"),
        (dict(opset_version="20"), TypeError, "to_onnx: opset_version: expected an int or None, got str"),
        (dict(opset=19, opset_version=20), ValueError, "to_onnx: opset: expected the same value as opset_version"),
        (dict(input_names=["a"]), ValueError, "to_onnx: input_names: expected 2 name(s)"),
        (dict(input_names=["a", "a"]), ValueError, "to_onnx: input_names: expected unique names"),
        (dict(output_names=["a", "b"]), ValueError, "to_onnx: output_names: expected 1 name(s)"),
        (dict(roi_inputs=["boxes"]), ValueError, "to_onnx: roi_inputs: expected names among input_names"),
        (dict(dynamic_axes={}), TypeError, "to_onnx: dynamic_axes: expected not given"),
    ],
)
def test_to_onnx_argument_errors(kwargs, exc, message, tmp_path):
    call = dict(model=samples.build("roi_head"), args=samples.sample_inputs("roi_head"), path=tmp_path / "m.onnx")
    call.update(kwargs)
    with pytest.raises(exc) as info:
        dcnkit.export.to_onnx(call.pop("model"), call.pop("args"), call.pop("path"), **call)
    assert message in str(info.value)
    assert not (tmp_path / "m.onnx").exists()


def test_to_onnx_names_and_axes(tmp_path):
    model = samples.build("roi_head")
    path = dcnkit.export.to_onnx(model, samples.sample_inputs("roi_head"), tmp_path / "m.onnx",
                                 input_names=["feats", "boxes"], output_names=["scores"], roi_inputs=["boxes"])
    proto = onnx.load(path)
    assert [_dims(i) for i in proto.graph.input] == [["batch", 8, 12, 12], ["num_rois", 5]]
    assert [o.name for o in proto.graph.output] == ["scores"]

    path = dcnkit.export.to_onnx(model, samples.sample_inputs("roi_head"), tmp_path / "s.onnx",
                                 dynamic_batch=False, dynamic_rois=False)
    proto = onnx.load(path)
    assert [_dims(i) for i in proto.graph.input] == [[2, 8, 12, 12], [3, 5]]


def test_plain_dynamo_export_in_fresh_process(tmp_path):
    """In a new interpreter, ``import dcnkit`` alone (no to_onnx, torch's exporter not yet loaded)
    makes the dynamo exporter translate our ops; onnxscript is not imported by ``import dcnkit``."""
    import subprocess
    import sys

    code = (
        "import sys, torch, dcnkit\n"
        "assert 'onnxscript' not in sys.modules, 'import dcnkit imported onnxscript'\n"
        "w = torch.randn(4, 3, 3, 3); x = torch.randn(2, 3, 6, 6); off = torch.randn(2, 18, 4, 4)\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x, off, rois):\n"
        "        y = dcnkit.ops.deform_conv2d(x, off, w)\n"
        "        return dcnkit.ops.roi_align(y, rois, 2, 1.0, 2, False, 'max')\n"
        "rois = torch.tensor([[0, 0, 0, 3, 3], [1, 1, 0, 2, 3.]])\n"
        f"torch.onnx.export(M(), (x, off, rois), {str(tmp_path / 'fresh.onnx')!r})\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=300)
    types = _node_types(onnx.load(str(tmp_path / "fresh.onnx")))
    assert ("", "DeformConv") in types and (DOMAIN, "RoIAlign") in types
