"""The files of the ONNX Runtime version matrix (tests/test_ort_versions.py): one-node models of every operator family
as three writers make them, one model, and the outputs of eager PyTorch on their inputs.

- ``kit_*``: ``dcnkit.export.to_onnx(..., opset=19, standard_ops=False)``, nodes of the ``dcnkit`` domain;
- ``std_*``: ``to_onnx(..., opset=19)`` with standard nodes where ONNX has the op (``DeformConv``, ``RoiAlign``);
- ``mm_*``: the names, input orders and attributes mmdeploy's and mmcv 1.x's symbolics write, built with
  ``onnx.helper`` (opset 19, IR 9) as those tools would export the same layer;
- ``model_dcn_resnet``: a small ResNet with DCNv2 in its last two stages (``dcnkit.nn.deformable_resnet``, offsets
  made non-zero), exported whole with standard nodes at opset 19;
- ``probe_asymmetric_pads``: a standard ``DeformConv`` with pads [1, 0, 0, 1], which the kit's kernel cannot represent:
  an error naming the attribute where the library serves ``DeformConv`` (ONNX Runtime < 1.26), ONNX Runtime's own
  kernel's result from 1.26 on (so it also shows which kernel a release runs).

Every case is a file, its inputs (``.npz``) and the eager outputs (``.npz``, ``output_<i>``): small tensors, a few KB.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper
from torch import nn

import dcnkit
from dcnkit import ops

OPSET = 19
IR = 9
# Where ONNX Runtime's own DeformConv kernel exists (the probe's expectation changes there).
BUILTIN_DEFORM_CONV = (1, 26)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(g, *shape, scale=1.0):
    return torch.randn(*shape, generator=g) * scale


def _uniform(g, *shape):
    return torch.rand(*shape, generator=g)


def _rois(g, k, n, size, min_size=2.0):
    """K rows [batch, x1, y1, x2, y2] inside a ``size`` x ``size`` image."""
    xy = _uniform(g, k, 2) * (size - min_size - 1)
    wh = min_size + _uniform(g, k, 2) * (size - min_size - 1 - xy)
    b = torch.randint(0, n, (k, 1), generator=g).float()
    return torch.cat([b, xy, xy + wh], 1)


# ---- the layers (forward inputs become graph inputs, parameters initializers) -----------------------------------


class DCN(nn.Module):
    def __init__(self, cin=4, cout=6, mask=True, bias=True, padding=(1, 1), seed=0):
        super().__init__()
        g = _gen(seed)
        self.weight = nn.Parameter(_rand(g, cout, cin, 3, 3, scale=0.3))
        self.bias = nn.Parameter(_rand(g, cout)) if bias else None
        self.padding = padding
        self.modulated = mask

    def forward(self, x, offset, mask=None):
        return ops.deform_conv2d(x, offset, self.weight, self.bias, padding=self.padding, mask=mask)


class RoIAlignLayer(nn.Module):
    def forward(self, x, rois):
        return ops.roi_align(x, rois, (3, 3), spatial_scale=0.5, sampling_ratio=2, aligned=True)


class DeformRoIPoolLayer(nn.Module):
    def forward(self, x, rois, offset):
        return ops.deform_roi_pool(x, rois, offset, (2, 2), spatial_scale=0.5, sampling_ratio=2, gamma=0.1)


class DeformPSRoIPoolLayer(nn.Module):
    def forward(self, x, rois, trans):
        out = ops.deform_psroi_pool(x, rois, trans, spatial_scale=0.5, output_size=2, output_dim=2, group_size=2,
                                    part_size=2, sample_per_part=2, trans_std=0.1)
        return out[0] if isinstance(out, (tuple, list)) else out


class MultiLevelLayer(nn.Module):
    def forward(self, rois, feat0, feat1):
        return ops.multi_level_roi_align([feat0, feat1], rois, (2, 2), [4.0, 8.0], sampling_ratio=2, finest_scale=8)


class MSDALayer(nn.Module):
    def forward(self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
        return ops.multi_scale_deformable_attn(value, spatial_shapes, level_start_index, sampling_locations,
                                               attention_weights)


DCNV3_ARGS = dict(kernel_h=3, kernel_w=3, stride_h=1, stride_w=1, pad_h=1, pad_w=1, dilation_h=1, dilation_w=1,
                  group=2, group_channels=4, offset_scale=1.0)


class DCNv3Layer(nn.Module):
    def forward(self, input, offset, mask):
        return ops.dcnv3(input, offset, mask, **DCNV3_ARGS)


class DCNv4Layer(nn.Module):
    def forward(self, value, offset_mask):
        return ops.dcnv4(value, offset_mask, **DCNV3_ARGS)


class AsymmetricDCN(nn.Module):
    """What a standard DeformConv with pads [t, l, b, r] = [1, 0, 0, 1] computes: the map zero-padded, no padding."""

    def __init__(self):
        super().__init__()
        self.dcn = DCN(padding=(0, 0), seed=5)

    def forward(self, x, offset, mask):
        return self.dcn(F.pad(x, (0, 1, 1, 0)), offset, mask)


def dcn_resnet() -> nn.Module:
    """A ResNet of torchvision's BasicBlocks (widths 8-32, one block per stage) with DCNv2 in stages 3 and 4."""
    from torchvision.models.resnet import BasicBlock

    class TinyResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
            widths, inplanes = (8, 16, 32, 32), 8
            for i, w in enumerate(widths, 1):
                stride = 1 if i == 1 else 2
                down = None
                if stride != 1 or inplanes != w:
                    down = nn.Sequential(nn.Conv2d(inplanes, w, 1, stride, bias=False), nn.BatchNorm2d(w))
                setattr(self, f"layer{i}", nn.Sequential(BasicBlock(inplanes, w, stride, down)))
                inplanes = w
            self.fc = nn.Linear(32, 5)

        def forward(self, images):
            y = self.layer4(self.layer3(self.layer2(self.layer1(self.stem(images)))))
            return self.fc(y.mean((2, 3)))

    torch.manual_seed(0)
    model = dcnkit.nn.deformable_resnet(TinyResNet(), stages=(3, 4))
    g = _gen(1)
    with torch.no_grad():  # offsets and masks that move the samples off the grid
        for m in model.modules():
            if isinstance(m, dcnkit.nn.ModulatedDeformConv2dPack):
                m.conv_offset.weight.copy_(_rand(g, *m.conv_offset.weight.shape, scale=0.1))
                m.conv_offset.bias.copy_(_rand(g, *m.conv_offset.bias.shape, scale=0.5))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(_rand(g, m.num_features, scale=0.1))
                m.running_var.copy_(0.5 + _uniform(g, m.num_features))
    return model.eval()


# ---- inputs --------------------------------------------------------------------------------------------------------


def _inputs(seed=0) -> dict[str, dict[str, torch.Tensor]]:
    g = _gen(seed)
    m = {}
    m["dcn"] = {"x": _rand(g, 1, 4, 7, 7), "offset": _rand(g, 1, 18, 7, 7, scale=1.5), "mask": _uniform(g, 1, 9, 7, 7)}
    m["dcn_v1"] = {"x": m["dcn"]["x"], "offset": m["dcn"]["offset"]}
    m["asym"] = {"x": _rand(g, 1, 4, 7, 7), "offset": _rand(g, 1, 18, 6, 6, scale=1.5), "mask": _uniform(g, 1, 9, 6, 6)}
    m["roi"] = {"x": _rand(g, 2, 3, 8, 8), "rois": _rois(g, 4, 2, 16)}
    m["droi"] = {"x": _rand(g, 1, 3, 8, 8), "rois": _rois(g, 3, 1, 16), "offset": _rand(g, 3, 2, 2, 2, scale=0.5)}
    m["psroi"] = {"x": _rand(g, 1, 8, 8, 8), "rois": _rois(g, 3, 1, 16), "trans": _rand(g, 3, 2, 2, 2, scale=0.5)}
    m["mlroi"] = {"rois": _rois(g, 4, 1, 64, min_size=4.0), "feat0": _rand(g, 1, 3, 16, 16),
                  "feat1": _rand(g, 1, 3, 8, 8)}
    shapes = torch.tensor([[4, 4], [2, 2]], dtype=torch.int64)
    m["msda"] = {"value": _rand(g, 1, 20, 2, 4), "spatial_shapes": shapes,
                 "level_start_index": torch.tensor([0, 16], dtype=torch.int64),
                 "sampling_locations": _uniform(g, 1, 5, 2, 2, 2, 2),
                 "attention_weights": torch.softmax(_rand(g, 1, 5, 2, 4), -1).reshape(1, 5, 2, 2, 2)}
    m["dcnv3"] = {"input": _rand(g, 1, 6, 6, 8), "offset": _rand(g, 1, 6, 6, 36, scale=0.8),
                  "mask": torch.softmax(_rand(g, 1, 6, 6, 2, 9), -1).reshape(1, 6, 6, 18)}
    m["dcnv4"] = {"value": _rand(g, 1, 6, 6, 8), "offset_mask": _rand(g, 1, 6, 6, 56, scale=0.8)}
    m["model"] = {"images": _rand(g, 1, 3, 32, 32)}
    return m


# ---- writers -------------------------------------------------------------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _export(module, feeds, path: Path, standard: bool) -> None:
    dcnkit.export.to_onnx(module, tuple(feeds.values()), path, opset=OPSET, standard_ops=standard,
                          input_names=list(feeds))


def _mm_model(path: Path, domain: str, op_type: str, feeds: dict, inputs: list, initializers: dict, **attrs) -> None:
    """A one-node model as mmdeploy / mmcv write it: ``inputs`` names graph inputs (``feeds``) and initializers."""
    f32 = TensorProto.FLOAT

    def vi(name, a):
        elem = TensorProto.INT64 if a.dtype == np.int64 else f32
        return helper.make_tensor_value_info(name, elem, list(a.shape))

    node = helper.make_node(op_type, inputs, ["output"], domain=domain, name=f"{op_type}_0", **attrs)
    graph = helper.make_graph([node], "g", [vi(n, a) for n, a in feeds.items()],
                              [helper.make_tensor_value_info("output", f32, None)],
                              initializer=[numpy_helper.from_array(a, n) for n, a in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(domain, 1)],
                              ir_version=IR)
    onnx.save(model, str(path))


def _pads_model(path: Path, dcn: DCN) -> None:
    f32 = TensorProto.FLOAT
    node = helper.make_node("DeformConv", ["x", "w", "offset", "b", "mask"], ["output"], name="asym",
                            pads=[1, 0, 0, 1], kernel_shape=[3, 3])
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", f32, [1, 4, 7, 7]), helper.make_tensor_value_info("offset", f32, None),
         helper.make_tensor_value_info("mask", f32, None)],
        [helper.make_tensor_value_info("output", f32, None)],
        initializer=[numpy_helper.from_array(_np(dcn.weight), "w"), numpy_helper.from_array(_np(dcn.bias), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR), str(path))


def build_cases(out: Path) -> list[dict]:
    """Writes every case into ``out`` and returns the manifest (also written as ``out/manifest.json``)."""
    torch.manual_seed(0)
    inp = _inputs()
    cases: list[dict] = []

    def add(name: str, write, module, feeds: dict, **extra) -> None:
        module.eval()
        with torch.no_grad():
            want = module(*feeds.values())
        want = want if isinstance(want, (tuple, list)) else (want,)
        np_feeds = {k: _np(v) for k, v in feeds.items()}
        write(out / f"{name}.onnx", np_feeds)
        np.savez(out / f"{name}.in.npz", **np_feeds)
        np.savez(out / f"{name}.want.npz", **{f"output_{i}": _np(w) for i, w in enumerate(want)})
        cases.append({"name": name, "file": f"{name}.onnx", "inputs": f"{name}.in.npz", "want": f"{name}.want.npz",
                      **extra})

    def exported(module, standard):
        return lambda path, np_feeds: _export(module, {k: torch.from_numpy(v) for k, v in np_feeds.items()}, path,
                                              standard)

    layers = {
        "deform_conv2d": (DCN().eval(), inp["dcn"]),
        "roi_align": (RoIAlignLayer(), inp["roi"]),
        "deform_roi_pool": (DeformRoIPoolLayer(), inp["droi"]),
        "deform_psroi_pool": (DeformPSRoIPoolLayer(), inp["psroi"]),
        "multi_level_roi_align": (MultiLevelLayer(), inp["mlroi"]),
        "msda": (MSDALayer(), inp["msda"]),
        "dcnv3": (DCNv3Layer(), inp["dcnv3"]),
        "dcnv4": (DCNv4Layer(), inp["dcnv4"]),
    }
    for family, (module, feeds) in layers.items():
        add(f"kit_{family}", exported(module, False), module, feeds)
    dcn_v1 = DCN(mask=False, bias=False, seed=3).eval()
    for name, module, feeds in (("deform_conv", layers["deform_conv2d"][0], inp["dcn"]),
                                ("deform_conv_v1", dcn_v1, inp["dcn_v1"]),
                                ("roi_align", layers["roi_align"][0], inp["roi"])):
        add(f"std_{name}", exported(module, True), module, feeds)

    # mmdeploy / mmcv 1.x names
    dcn = layers["deform_conv2d"][0]
    w, b = _np(dcn.weight), _np(dcn.bias)
    dcn_attrs = dict(stride=[1, 1], padding=[1, 1], dilation=[1, 1], groups=1, deform_groups=1)
    add("mm_modulated_deform_conv2d",
        lambda p, f: _mm_model(p, "mmdeploy", "MMCVModulatedDeformConv2d", f, ["x", "offset", "mask", "weight", "bias"],
                               {"weight": w, "bias": b}, **dcn_attrs), dcn, inp["dcn"])
    add("mm_deform_conv2d",
        lambda p, f: _mm_model(p, "mmcv", "MMCVDeformConv2d", f, ["x", "offset", "weight"],
                               {"weight": _np(dcn_v1.weight)}, bias=0, im2col_step=32, **dcn_attrs),
        dcn_v1, inp["dcn_v1"])
    add("mm_roi_align",
        lambda p, f: _mm_model(p, "mmcv", "MMCVRoiAlign", f, ["x", "rois"], {}, output_height=3, output_width=3,
                               spatial_scale=0.5, sampling_ratio=2, mode="avg", aligned=1),
        layers["roi_align"][0], inp["roi"])
    add("mm_deform_roi_pool",
        lambda p, f: _mm_model(p, "mmcv", "MMCVDeformRoIPool", f, ["x", "rois", "offset"], {}, pooled_height=2,
                               pooled_width=2, spatial_scale=0.5, sampling_ratio=2.0, gamma=0.1),
        layers["deform_roi_pool"][0], inp["droi"])
    add("mm_multi_level_roi_align",
        lambda p, f: _mm_model(p, "mmdeploy", "MMCVMultiLevelRoiAlign", f, ["rois", "feat0", "feat1"], {},
                               output_height=2, output_width=2, featmap_strides=[4.0, 8.0], sampling_ratio=2,
                               finest_scale=8, roi_scale_factor=1.0, aligned=1, pool_mode=1),
        layers["multi_level_roi_align"][0], inp["mlroi"])
    add("mm_msda",
        lambda p, f: _mm_model(p, "mmdeploy", "MMCVMultiScaleDeformableAttention", f, list(f), {}, im2col_step=64),
        layers["msda"][0], inp["msda"])
    add("mm_dcnv3",
        lambda p, f: _mm_model(p, "mmdeploy", "TRTDCNv3", f, ["input", "offset", "mask"], {}, im2col_step=256,
                               remove_center=0, **DCNV3_ARGS),
        layers["dcnv3"][0], inp["dcnv3"])

    model = dcn_resnet()
    add("model_dcn_resnet", exported(model, True), model, inp["model"])

    asym = AsymmetricDCN().eval()
    add("probe_asymmetric_pads", lambda p, f: _pads_model(p, asym.dcn), asym, inp["asym"],
        error_before=list(BUILTIN_DEFORM_CONV), error="symmetric pads")

    (out / "manifest.json").write_text(json.dumps(cases, indent=1))
    return cases
