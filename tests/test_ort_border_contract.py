"""The operator contract at the map's border through ``ort_session``'s default (docs/operators.md: offsets or inputs
that are NaN or infinite), with no exception: every standard DeformConv runs on the kit's kernel on the CPU execution
provider, whatever its map's size, and its outputs are non-finite exactly where the NumPy reference's (and
torchvision's) are. ONNX Runtime's built-in DeformConv (1.26 and later, ``kit_kernels=False``) reads out-of-map
neighbours with weight 0 (0 x Inf = NaN at the border): shown here as the difference the default avoids."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session
from dcnkit.runtime.ort_rewrite import count_deform_conv, rewrite_deform_conv

CPU = ["CPUExecutionProvider"]


def _case():
    """A 6x6 map (36 positions) with an Inf at pixel (0, 0), offsets +0.5 (dy) / -0.75 (dx) at every kernel point."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 6, 6)).astype(np.float32)
    x[0, 0, 0, 0] = np.inf
    offset = np.zeros((1, 18, 6, 6), np.float32)
    offset[:, 0::2], offset[:, 1::2] = 0.5, -0.75
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    f = TensorProto.FLOAT
    graph = helper.make_graph(
        [helper.make_node("DeformConv", ["x", "w", "offset"], ["y"], pads=[1, 1, 1, 1], kernel_shape=[3, 3])], "g",
        [helper.make_tensor_value_info("x", f, [1, 2, 6, 6]), helper.make_tensor_value_info("offset", f, [1, 18, 6, 6])],
        [helper.make_tensor_value_info("y", f, None)], initializer=[numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    want = ref.deform_conv2d(x, offset, w, None, padding=(1, 1))
    return model, {"x": x, "offset": offset}, want


def _check_contract(got, want):
    bad = ~np.isfinite(want)
    assert 0 < bad.sum() < want.size  # the Inf reaches some outputs with a non-zero weight, not all
    np.testing.assert_array_equal(~np.isfinite(got), bad)
    np.testing.assert_allclose(got[~bad], want[~bad], rtol=1e-5, atol=1e-5)


def test_ort_session_keeps_the_border_contract_on_a_small_map():
    model, feeds, want = _case()
    default = ort_session(model, providers=CPU).run(None, feeds)[0]  # 36 positions: the kit's kernel all the same
    _check_contract(default, want)
    everywhere, n = rewrite_deform_conv(model)  # the rewrite ort_session makes, explicitly
    assert n == 1 and count_deform_conv(everywhere) == 0
    np.testing.assert_array_equal(ort_session(everywhere, providers=CPU).run(None, feeds)[0], default)
    torchvision = pytest.importorskip("torchvision")
    import torch

    tv = torchvision.ops.deform_conv2d(torch.from_numpy(feeds["x"]), torch.from_numpy(feeds["offset"]),
                                       torch.from_numpy(model_weight(model)), padding=(1, 1)).numpy()
    finite = np.isfinite(tv)
    assert np.isfinite(default[finite]).all()  # finite wherever torchvision's is
    np.testing.assert_allclose(default[finite], tv[finite], rtol=1e-5, atol=1e-5)
    builtin = ort_session(model, providers=CPU, kit_kernels=False).run(None, feeds)[0]
    print(f"\nnon-finite outputs: contract {int((~np.isfinite(want)).sum())}, ort_session default "
          f"{int((~np.isfinite(default)).sum())}, torchvision {int((~finite).sum())}, ONNX Runtime's built-in "
          f"{int((~np.isfinite(builtin)).sum())} of {want.size}")


def model_weight(model):
    return numpy_helper.to_array(model.graph.initializer[0])


def test_on_finite_inputs_both_kernels_agree():
    model, feeds, _ = _case()
    feeds = dict(feeds, x=np.nan_to_num(feeds["x"], posinf=3.0))
    kit = ort_session(rewrite_deform_conv(model)[0], providers=CPU).run(None, feeds)[0]
    default = ort_session(model, providers=CPU).run(None, feeds)[0]
    np.testing.assert_allclose(default, kit, rtol=1e-5, atol=1e-5)


def test_an_infinite_mask_on_a_point_half_off_the_map_follows_the_reference():
    """A neighbour outside the map is not part of the sum, whatever the mask: an infinite mask on a point whose
    cell straddles the border gives what the reference gives (+-Inf from the neighbours on the map), not the NaN of an
    infinite weight times the zero that stands for the outside."""
    import torch

    import dcnkit

    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    offset = np.zeros((1, 18, 5, 5), np.float32)
    offset[:, 0::2], offset[:, 1::2] = 0.25, -0.5  # every point off the grid lines: four neighbours of weight > 0
    mask = rng.uniform(0.5, 1.0, (1, 9, 5, 5)).astype(np.float32)
    mask[0, 4, 0, 0] = -np.inf  # the centre point of output (0, 0): x = -0.5, its left neighbours are off the map
    mask[0, 0, 2, 2] = np.inf  # a point inside: all four neighbours on the map
    w = rng.uniform(0.1, 1.0, (3, 2, 3, 3)).astype(np.float32)  # one sign: the Infs of a column do not cancel
    x = np.abs(x) + 0.1
    want = ref.deform_conv2d(x, offset, w, None, padding=(1, 1), mask=mask)
    assert np.isinf(want[0, :, 0, 0]).all() and np.isinf(want[0, :, 2, 2]).all()
    got = dcnkit.ops.deform_conv2d(torch.from_numpy(x), torch.from_numpy(offset), torch.from_numpy(w), None,
                                   padding=1, mask=torch.from_numpy(mask)).numpy()
    np.testing.assert_array_equal(got, np.where(np.isfinite(want), got, want))  # the same Infs, signs included
    np.testing.assert_allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-5, atol=1e-5)
