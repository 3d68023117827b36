"""``to_onnx`` writes the lowest IR version the file's opsets allow (issue 35): opset 19 -> IR 9, which ONNX Runtime
1.16 reads (it reads IR <= 9; torch's dynamo exporter writes IR 10). That the files then load and run in ONNX Runtime
1.16 ... newest is tests/test_ort_versions.py's matrix."""
from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import dcnkit
from dcnkit.export import lower_ir_version


class _DCN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dcn = dcnkit.nn.ModulatedDeformConv2dPack(3, 4, 3, padding=1)

    def forward(self, x):
        return self.dcn(x)


@pytest.mark.parametrize("opset, standard, ir", [(19, True, 9), (19, False, 9), (21, True, 10)])
def test_export_writes_the_ir_version_its_opset_needs(tmp_path, opset, standard, ir):
    path = dcnkit.export.to_onnx(_DCN().eval(), torch.randn(1, 3, 6, 6), tmp_path / "m.onnx", opset=opset,
                                 standard_ops=standard)
    m = onnx.load(path)
    assert m.ir_version == ir
    assert {o.domain: o.version for o in m.opset_import}[""] == opset
    assert ("DeformConv" if standard else "DeformConv2d") in [n.op_type for n in m.graph.node]
    onnx.checker.check_model(m, full_check=True)


def _model(elem_type, ir_version=10, opset=19):
    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", elem_type, [2])],
                          [helper.make_tensor_value_info("y", elem_type, [2])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=ir_version)


def test_lower_ir_version_keeps_what_the_newer_ir_needs(tmp_path):
    onnx.save(_model(TensorProto.FLOAT), tmp_path / "f.onnx")
    assert lower_ir_version(tmp_path / "f.onnx") == 9 and onnx.load(tmp_path / "f.onnx").ir_version == 9
    onnx.save(_model(TensorProto.INT4), tmp_path / "i4.onnx")  # 4-bit types came with IR 10
    assert lower_ir_version(tmp_path / "i4.onnx") == 10 and onnx.load(tmp_path / "i4.onnx").ir_version == 10
    onnx.save(_model(TensorProto.FLOAT, ir_version=8, opset=17), tmp_path / "old.onnx")  # never raised
    assert lower_ir_version(tmp_path / "old.onnx") == 8
    m = _model(TensorProto.FLOAT)
    m.graph.node[0].overload = "v2"  # function overloads came with IR 10
    onnx.save(m, tmp_path / "ov.onnx")
    assert lower_ir_version(tmp_path / "ov.onnx") == 10
