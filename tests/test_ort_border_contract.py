"""The exception ``ort_session``'s per-node rule makes to the operator contract (issue 35, item 9; documented in
dcnkit.runtime.ort_rewrite): a map of fewer than KIT_MIN_OUTPUT_POSITIONS positions stays on ONNX Runtime's built-in
DeformConv, which reads out-of-map neighbours with weight 0 (0 x Inf = NaN at the border); the kit's kernel keeps the
contract (non-finite exactly where the NumPy reference of docs/operators.md is), also when every node is rewritten."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from dcnkit import reference as ref
from dcnkit.runtime import ort_session
from dcnkit.runtime.ort_rewrite import KIT_MIN_OUTPUT_POSITIONS, count_deform_conv, rewrite_deform_conv

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


def test_the_kits_kernel_keeps_the_border_contract_and_the_rule_hands_small_maps_to_the_builtin():
    model, feeds, want = _case()
    assert 36 < KIT_MIN_OUTPUT_POSITIONS
    everywhere, n = rewrite_deform_conv(model)  # every node on the kit's kernel
    assert n == 1 and count_deform_conv(everywhere) == 0
    kit = ort_session(everywhere, providers=CPU).run(None, feeds)[0]
    bad = ~np.isfinite(want)
    assert 0 < bad.sum() < want.size  # the Inf reaches some outputs with a non-zero weight, not all
    np.testing.assert_array_equal(~np.isfinite(kit), bad)
    np.testing.assert_allclose(kit[~bad], want[~bad], rtol=1e-5, atol=1e-5)
    # ort_session's default leaves this node to ONNX Runtime's own DeformConv (the documented exception): the same
    # outputs as kit_kernels=False, NaN included.
    default = ort_session(model, providers=CPU).run(None, feeds)[0]
    builtin = ort_session(model, providers=CPU, kit_kernels=False).run(None, feeds)[0]
    np.testing.assert_array_equal(default, builtin)  # equal_nan: NaN positions must match too
    print(f"\nnon-finite outputs: contract {int(bad.sum())}, kit {int((~np.isfinite(kit)).sum())}, "
          f"ort_session default {int((~np.isfinite(default)).sum())} of {want.size}")


def test_on_finite_inputs_both_kernels_agree():
    model, feeds, _ = _case()
    feeds = dict(feeds, x=np.nan_to_num(feeds["x"], posinf=3.0))
    kit = ort_session(rewrite_deform_conv(model)[0], providers=CPU).run(None, feeds)[0]
    default = ort_session(model, providers=CPU).run(None, feeds)[0]
    np.testing.assert_allclose(default, kit, rtol=1e-5, atol=1e-5)
