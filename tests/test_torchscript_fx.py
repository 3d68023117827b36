"""The ops and modules under TorchScript (script, trace, save/load in a fresh process) and torch.fx.

Every functional op and every dcnkit.nn module: torch.jit.script, torch.fx.symbolic_trace and torch.jit.trace
compute what eager mode computes (and, for the functional ops, what the NumPy reference computes); the
argument checks keep their messages inside TorchScript and run in the traced GraphModule; a scripted model
saved with torch.jit.save runs in a fresh process after `import dcnkit`, and also with nothing but the torch
operator library loaded (what a C++ program does).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
import zipfile
from typing import List, Optional, Tuple

import numpy as np
import pytest
import torch
from torch import Tensor

import dcnkit.ops
from dcnkit import nn as dnn
from dcnkit import reference as R
from dcnkit._lib import find_library
from dcnkit.ops import deform_conv2d, deform_psroi_pool, deform_roi_pool, multi_level_roi_align, roi_align

from test_roi_align import rand_rois

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.*` is deprecated:FutureWarning")

_NP = lambda t: None if t is None else t.detach().double().numpy()  # noqa: E731


# ---- functional ops --------------------------------------------------------------------------------


def dcn_fn(x: Tensor, offset: Tensor, weight: Tensor, bias: Optional[Tensor], mask: Optional[Tensor]) -> Tensor:
    return deform_conv2d(x, offset, weight, bias, stride=1, padding=(1, 1), dilation=1, mask=mask)


def roi_align_fn(x: Tensor, rois: Tensor, boxes: List[Tensor]) -> Tuple[Tensor, Tensor]:
    return roi_align(x, rois, (3, 2), 0.5, 2, True, "max"), roi_align(x, boxes, 2, 0.5)


def deform_roi_pool_fn(x: Tensor, rois: Tensor, offset: Optional[Tensor]) -> Tensor:
    return deform_roi_pool(x, rois, offset, (2, 3), 0.5, 2, 0.2)


def deform_psroi_pool_fn(x: Tensor, rois: Tensor, trans: Optional[Tensor]) -> Tensor:
    return deform_psroi_pool(x, rois, trans, 0.5, 3, 2, group_size=2, part_size=2, sample_per_part=2, trans_std=0.1)


def multi_level_roi_align_fn(f0: Tensor, f1: Tensor, rois: Tensor) -> Tensor:
    return multi_level_roi_align([f0, f1], rois, (2, 3), [2.0, 4.0], 2, 4, 1.0, True, "max")


def _multi_level_reference(maps, rois, strides, finest_scale):
    """Per RoI: docs/operators.md's level rule, then the NumPy RoIAlign on that level (max, aligned, ratio 2)."""
    r = _NP(rois)
    s = np.sqrt((r[:, 3] - r[:, 1]) * (r[:, 4] - r[:, 2]))
    lvl = np.clip(np.nan_to_num(np.floor(np.log2(s / finest_scale + 1e-6)), nan=0.0), 0, len(maps) - 1).astype(int)
    return np.concatenate([R.roi_align(_NP(maps[lv]), r[k:k + 1], (2, 3), 1.0 / strides[lv], 2, True, "max")
                           for k, lv in enumerate(lvl)])


def _op_cases():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 8, 9, 9, dtype=torch.float64, generator=g)
    rois = rand_rois(4, 2, 18, 18)
    boxes = [rois[:2, 1:], rois[2:, 1:]]
    off = torch.randn(2, 36, 9, 9, dtype=torch.float64, generator=g)
    w = torch.randn(6, 4, 3, 3, dtype=torch.float64, generator=g)
    b = torch.randn(6, dtype=torch.float64, generator=g)
    mask = torch.rand(2, 18, 9, 9, dtype=torch.float64, generator=g)
    roff = torch.randn(4, 2, 2, 3, dtype=torch.float64, generator=g)
    trans = torch.randn(4, 2, 2, 2, dtype=torch.float64, generator=g)
    rois_from_boxes = torch.cat([torch.tensor([[0.0], [0.0], [1.0], [1.0]], dtype=torch.float64), rois[:, 1:]], 1)
    f1 = torch.randn(2, 8, 5, 5, dtype=torch.float64, generator=g)
    ml_rois = torch.tensor([[0, 1.0, 2.0, 5.5, 6.0], [1, 0.5, 1.0, 14.0, 12.5], [1, 3.0, 2.0, 7.0, 9.0],
                            [0, 2.0, 2.5, 17.0, 16.0]], dtype=torch.float64)  # levels 0, 1, 0, 1
    return [
        ("deform_conv2d", dcn_fn, (x, off, w, b, mask),
         [R.deform_conv2d(_NP(x), _NP(off), _NP(w), _NP(b), (1, 1), (1, 1), (1, 1), _NP(mask))]),
        ("deform_conv2d", dcn_fn, (x, off, w, None, None),
         [R.deform_conv2d(_NP(x), _NP(off), _NP(w), None, (1, 1), (1, 1), (1, 1), None)]),
        ("roi_align", roi_align_fn, (x, rois, boxes),
         [R.roi_align(_NP(x), _NP(rois), (3, 2), 0.5, 2, True, "max"),
          R.roi_align(_NP(x), _NP(rois_from_boxes), (2, 2), 0.5, -1, False, "avg")]),
        ("deform_roi_pool", deform_roi_pool_fn, (x, rois, roff),
         [R.deform_roi_pool(_NP(x), _NP(rois), _NP(roff), (2, 3), 0.5, 2, 0.2)]),
        ("deform_roi_pool", deform_roi_pool_fn, (x, rois, None),
         [R.deform_roi_pool(_NP(x), _NP(rois), None, (2, 3), 0.5, 2, 0.2)]),
        ("deform_psroi_pool", deform_psroi_pool_fn, (x, rois, trans),
         [R.deform_psroi_pool(_NP(x), _NP(rois), _NP(trans), 0.5, 3, 2, 2, 2, 2, 0.1)[0]]),
        ("multi_level_roi_align", multi_level_roi_align_fn, (x, f1, ml_rois),
         [_multi_level_reference([x, f1], ml_rois, [2.0, 4.0], 4)]),
    ]


def _as_list(y):
    return list(y) if isinstance(y, (list, tuple)) else [y]


def _assert_ref(got, expected):
    got = _as_list(got)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, torch.from_numpy(e), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", range(7))
def test_script_functional_ops(case):
    name, fn, args, expected = _op_cases()[case]
    scripted = torch.jit.script(fn)
    _assert_ref(scripted(*args), expected)
    _assert_ref(fn(*args), expected)
    # The scripted code calls the registered operator (what a C++ program that loads the library runs).
    assert f"dcnkit::{name}" in str(scripted.inlined_graph)


@pytest.mark.parametrize("case", range(7))
def test_fx_trace_functional_ops(case):
    name, fn, args, expected = _op_cases()[case]
    gm = torch.fx.symbolic_trace(fn)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert getattr(dcnkit.ops, name) in targets  # one leaf node, not traced through
    _assert_ref(gm(*args), expected)


def test_fx_leaf_through_every_import_style():
    """A user's `from dcnkit.ops import roi_align` (a name torch.fx.wrap does not patch) is a leaf too."""
    from dcnkit.ops import roi_align as imported

    def fn(x, boxes):
        return imported(x, boxes, 2, 0.5) + dcnkit.ops.roi_align(x, boxes, 2, 0.5)

    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    boxes = [rand_rois(2, 1, 16, 16)[:, 1:], rand_rois(3, 1, 16, 16)[:, 1:]]
    gm = torch.fx.symbolic_trace(fn)
    leaves = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is roi_align]
    assert len(leaves) == 2
    torch.testing.assert_close(gm(x, boxes), 2 * roi_align(x, boxes, 2, 0.5), rtol=0, atol=0)


def test_jit_trace_functional_ops():
    for name, fn, args, expected in _op_cases():
        if any(a is None for a in args):
            continue  # torch.jit.trace takes tensors only (the cases with None are scripted and fx-traced)
        with warnings.catch_warnings():
            warnings.simplefilter("error", torch.jit.TracerWarning)  # no warning from our argument checks
            traced = torch.jit.trace(fn, args, check_trace=False)
        _assert_ref(traced(*args), expected)


def test_script_keeps_error_messages():
    _, fn, args, _ = _op_cases()[0]
    scripted = torch.jit.script(fn)
    x, off, w, b, mask = args
    with pytest.raises(torch.jit.Error, match=r"deform_conv2d: input: expected a 4-D tensor \(N, Cin, H, W\), "
                                              r"got shape \[8, 9, 9\]"):
        scripted(x[0], off, w, b, mask)
    with pytest.raises(torch.jit.Error, match=r"deform_conv2d: offset: expected channels \(dim 1\) a positive "
                                              r"multiple of 2\*kh\*kw = 18, got 17"):
        scripted(x, off[:, :17], w, b, mask)
    with pytest.raises(RuntimeError, match=r"deform_conv2d: offset: expected dtype Double"):  # the C++ op
        scripted(x, off.float(), w, b, mask)
    with pytest.raises(ValueError, match=r"deform_conv2d: offset: expected channels \(dim 1\) a positive multiple"):
        fn(x, off[:, :17], w, b, mask)

    _, rfn, (x, rois, boxes), _ = _op_cases()[2]
    scripted = torch.jit.script(rfn)
    with pytest.raises(torch.jit.Error, match=r"roi_align: boxes\[1\]: expected a Tensor\[L, 4\], got \[3, 5\]"):
        scripted(x, rois, [boxes[0], rois[:3]])
    with pytest.raises(torch.jit.Error, match=r"roi_align: boxes: expected a Tensor\[K, 5\] or a list of "
                                              r"Tensor\[L, 4\], got a tensor of shape \[4, 4\]"):
        scripted(x, rois[:, 1:], boxes)

    def bad_mode(x: Tensor, rois: Tensor) -> Tensor:
        return roi_align(x, rois, 2, 1.0, 0, False, "min")

    with pytest.raises(torch.jit.Error, match=r"roi_align: pool_mode: expected 'avg' or 'max', got 'min'"):
        torch.jit.script(bad_mode)(x, rois)
    with pytest.raises(ValueError, match=r"roi_align: pool_mode: expected 'avg' or 'max', got 'min'"):
        bad_mode(x, rois)


# ---- modules ---------------------------------------------------------------------------------------


def _module_cases():
    """(module, inputs) for every dcnkit.nn module, with non-trivial offsets, masks and Pack weights."""
    torch.manual_seed(5)
    x = torch.randn(2, 8, 10, 10)
    rois = rand_rois(5, 2, 20, 20, dtype=torch.float32)
    cases = [
        (dnn.DeformConv2d(8, 6, 3, padding=1, deform_groups=2), (x, torch.randn(2, 36, 10, 10))),
        (dnn.ModulatedDeformConv2d(8, 6, (3, 1), padding=(1, 0), groups=2),
         (x, torch.randn(2, 6, 10, 10), torch.rand(2, 3, 10, 10))),
        (dnn.DeformConv2dPack(8, 6, 3, stride=2, padding=1, deform_groups=2), (x,)),
        (dnn.ModulatedDeformConv2dPack(8, 6, 3, padding=2, dilation=2), (x,)),
        (dnn.RoIAlign((3, 2), 0.5, 2, "max"), (x, rois)),
        (dnn.RoIAlign(2, 0.5, 0, use_torchvision=True), (x, rois)),
        (dnn.DeformRoIPool(2, 0.5, 2, 0.2), (x, rois, torch.randn(5, 2, 2, 2))),
        (dnn.DeformRoIPoolPack((2, 3), 8, 16, 0.5), (x, rois)),
        (dnn.ModulatedDeformRoIPoolPack(2, 8, 16, 0.5), (x, rois)),
        (dnn.DeformPSRoIPool(0.5, 2, 2, group_size=2, part_size=2, trans_std=0.1), (x, rois, torch.randn(5, 2, 2, 2))),
        (dnn.DeformPSRoIPool(0.5, 2, 2, group_size=2, no_trans=True), (x, rois)),
    ]
    for m, _ in cases:
        with torch.no_grad():  # the Packs start at zero offsets: make them predict real ones
            for name, p in m.named_parameters():
                if "offset" in name or "mask_fc" in name:
                    p.normal_(0, 0.05)
        m.eval()
    return cases


_MODULE_IDS = ["DeformConv2d", "ModulatedDeformConv2d", "DeformConv2dPack", "ModulatedDeformConv2dPack", "RoIAlign",
               "RoIAlign-torchvision", "DeformRoIPool", "DeformRoIPoolPack", "ModulatedDeformRoIPoolPack",
               "DeformPSRoIPool", "DeformPSRoIPool-no_trans"]


@pytest.mark.parametrize("case", range(len(_MODULE_IDS)), ids=_MODULE_IDS)
def test_module_script_fx_trace(case):
    if _MODULE_IDS[case] == "RoIAlign-torchvision":
        pytest.importorskip("torchvision")
    m, args = _module_cases()[case]
    expected = m(*args)
    assert expected.abs().sum() > 0
    scripted = torch.jit.script(m)
    torch.testing.assert_close(scripted(*args), expected, rtol=0, atol=0)
    gm = torch.fx.symbolic_trace(m)
    torch.testing.assert_close(gm(*args), expected, rtol=0, atol=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)
        traced = torch.jit.trace(m, args)
    torch.testing.assert_close(traced(*args), expected, rtol=0, atol=0)

    # Gradients (input and parameters) through the scripted and the fx module equal eager ones.
    grads = []
    for run in (m, scripted, gm):
        m.zero_grad()
        xg = args[0].clone().requires_grad_()
        run(xg, *args[1:]).square().sum().backward()
        grads.append([xg.grad] + [p.grad.clone() for p in m.parameters()])
    assert grads[0][0].abs().sum() > 0
    for other in grads[1:]:
        for g, e in zip(other, grads[0]):  # float32; TorchScript may order the autograd sums differently
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


def test_modules_match_reference():
    """Two modules against the NumPy reference, scripted (the rest equal eager, tested elsewhere)."""
    (dcn, (x, off)), _, _, _, (ra, (_, rois)) = _module_cases()[:5]
    got = torch.jit.script(dcn.double())(x.double(), off.double())
    expected = R.deform_conv2d(_NP(x), _NP(off), _NP(dcn.weight), None, (1, 1), (1, 1), (1, 1), None)
    torch.testing.assert_close(got, torch.from_numpy(expected), rtol=1e-12, atol=1e-12)
    got = torch.jit.script(ra)(x.double(), rois.double())
    torch.testing.assert_close(got, torch.from_numpy(R.roi_align(_NP(x), _NP(rois), (3, 2), 0.5, 2, True, "max")),
                               rtol=1e-12, atol=1e-12)


def test_fx_graph_keeps_leaves_and_checks():
    m = dnn.DeformConv2d(8, 8, 3, padding=1, deform_groups=2)
    gm = torch.fx.symbolic_trace(m)
    targets = {getattr(n.target, "__name__", n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert {"deform_conv2d", "_check_deform_groups"} <= targets
    x = torch.randn(1, 8, 6, 6)
    with pytest.raises(ValueError, match=r"DeformConv2d: offset: expected 36 channels .*deform_groups = 2.*got 18"):
        gm(x, torch.zeros(1, 18, 6, 6))
    pack = dnn.DeformRoIPoolPack(2, 4, 8)
    with pytest.raises(ValueError, match=r"DeformRoIPoolPack: input: expected 4 channels \(output_channels\), got 3"):
        torch.fx.symbolic_trace(pack)(torch.randn(1, 3, 8, 8), torch.tensor([[0.0, 1, 1, 5, 5]]))
    with pytest.raises(torch.jit.Error, match=r"DeformRoIPoolPack: input: expected 4 channels"):
        torch.jit.script(pack)(torch.randn(1, 3, 8, 8), torch.tensor([[0.0, 1, 1, 5, 5]]))


def test_fx_model_with_every_module():
    """A model mixing our modules with torch layers traces into one GraphModule with the same output."""

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.dcn = dnn.ModulatedDeformConv2dPack(8, 8, 3, padding=1, deform_groups=2)
            self.pool = dnn.ModulatedDeformRoIPoolPack(2, 8, 16, 0.5)
            self.ps = dnn.DeformPSRoIPool(0.5, 2, 2, group_size=2)
            self.fc = torch.nn.Linear(8 * 4 + 2 * 4, 3)

        def forward(self, img, rois):
            f = torch.relu(self.dcn(self.stem(img)))
            a = self.pool(f, rois).flatten(1)
            b = self.ps(f, rois).flatten(1)
            return self.fc(torch.cat([a, b], 1))

    net = Net().eval()
    with torch.no_grad():
        net.dcn.conv_offset.weight.normal_(0, 0.05)
        net.pool.offset_fc[-1].weight.normal_(0, 0.05)
    img, rois = torch.randn(2, 3, 12, 12), rand_rois(4, 2, 24, 24, dtype=torch.float32)
    gm = torch.fx.symbolic_trace(net)
    torch.testing.assert_close(gm(img, rois), net(img, rois), rtol=0, atol=0)


# ---- save / load -----------------------------------------------------------------------------------

_LOAD_CHILD = textwrap.dedent("""
    import sys
    import torch
    if sys.argv[1] == "import-dcnkit":
        import dcnkit  # noqa: F401
    else:  # only the operator library, as a C++ program loads it: no Python registrations of dcnkit
        torch.ops.load_library(sys.argv[1])
        assert "dcnkit" not in sys.modules
    args = torch.load(sys.argv[3])
    m = torch.jit.load(sys.argv[2])
    with torch.no_grad():
        out = m(*args)
    torch.save(out, sys.argv[4])
""")


class _AllModules(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.dcn1 = dnn.DeformConv2dPack(8, 8, 3, padding=1, deform_groups=2)
        self.dcn2 = dnn.ModulatedDeformConv2dPack(8, 8, 3, padding=1)
        self.align = dnn.RoIAlign(2, 0.5, 2)
        self.pool = dnn.DeformRoIPoolPack(2, 8, 16, 0.5)
        self.mpool = dnn.ModulatedDeformRoIPoolPack(2, 8, 16, 0.5)
        self.ps = dnn.DeformPSRoIPool(0.5, 2, 2, group_size=2, trans_std=0.1)

    def forward(self, x: Tensor, rois: Tensor, trans: Tensor) -> List[Tensor]:
        f = self.dcn2(self.dcn1(x))
        return [f, self.align(f, rois), self.pool(f, rois), self.mpool(f, rois), self.ps(f, rois, trans)]


@pytest.mark.parametrize("loader", ["import-dcnkit", "library-only"])
def test_saved_script_runs_in_fresh_process(tmp_path, loader):
    m = _AllModules().eval()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "offset" in name or "mask_fc" in name:
                p.normal_(0, 0.05)
    args = (torch.randn(2, 8, 10, 10), rand_rois(4, 2, 20, 20, dtype=torch.float32), torch.randn(4, 2, 2, 2))
    scripted = torch.jit.script(m)
    torch.jit.save(scripted, str(tmp_path / "m.pt"))
    torch.save(args, tmp_path / "in.pt")
    with torch.no_grad():
        expected = m(*args)
    which = "import-dcnkit" if loader == "import-dcnkit" else str(find_library("dcnkit_torch"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    subprocess.run([sys.executable, "-c", _LOAD_CHILD, which, str(tmp_path / "m.pt"), str(tmp_path / "in.pt"),
                    str(tmp_path / "out.pt")], check=True, timeout=300, env=env, cwd=tmp_path)
    got = torch.load(tmp_path / "out.pt")
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    # The saved code calls the registered operators.
    with zipfile.ZipFile(tmp_path / "m.pt") as z:
        code = "".join(z.read(n).decode() for n in z.namelist() if n.endswith(".py"))
    for op in ("deform_conv2d", "roi_align", "deform_roi_pool", "deform_psroi_pool"):
        assert f"ops.dcnkit.{op}(" in code


def test_script_roi_align_module_without_torchvision(tmp_path):
    """use_torchvision=False compiles without torchvision (its branch is a TorchScript constant)."""
    child = textwrap.dedent("""
        import sys
        sys.modules["torchvision"] = None  # import torchvision now fails
        import torch
        from dcnkit.nn import RoIAlign
        m = torch.jit.script(RoIAlign(2, 0.5, 2))
        x = torch.arange(64.0).reshape(1, 1, 8, 8)
        y = m(x, torch.tensor([[0.0, 0, 0, 6, 6]]))
        assert y.shape == (1, 1, 2, 2) and torch.isfinite(y).all()
        try:
            RoIAlign(2, use_torchvision=True)
        except ImportError:
            print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", child], check=True, timeout=300, capture_output=True, text=True)
    assert out.stdout.strip().endswith("ok")
