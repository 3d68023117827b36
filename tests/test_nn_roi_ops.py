"""RoI modules (mmcv's arguments and parameter names), torch.compile(fullgraph=True) and torch.export."""
import pytest
import torch

import dcnkit  # noqa: F401
from dcnkit import reference as R
from dcnkit.nn import DeformPSRoIPool, DeformRoIPool, DeformRoIPoolPack, ModulatedDeformRoIPoolPack, RoIAlign
from dcnkit.ops import deform_psroi_pool, deform_roi_pool, roi_align

from test_roi_align import rand_rois


def test_roi_align_module():
    m = RoIAlign((3, 2), spatial_scale=0.5, sampling_ratio=2, pool_mode="max", aligned=True)
    assert m.output_size == (3, 2) and m.spatial_scale == 0.5 and m.sampling_ratio == 2
    assert m.pool_mode == "max" and m.aligned and not m.use_torchvision
    assert list(m.parameters()) == []
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    rois = rand_rois(4, 2, 16, 16)
    expected = R.roi_align(x.numpy(), rois.numpy(), (3, 2), 0.5, 2, True, "max")
    torch.testing.assert_close(m(x, rois), torch.from_numpy(expected))
    # mmcv's defaults: sampling_ratio 0, avg, aligned.
    d = RoIAlign(2)
    torch.testing.assert_close(d(x, rois), roi_align(x, rois, 2, 1.0, 0, True, "avg"))
    tv = RoIAlign(2, 0.5, 2, use_torchvision=True)
    torch.testing.assert_close(tv(x, rois), roi_align(x, rois, 2, 0.5, 2, True))
    with pytest.raises(ValueError, match="pool_mode"):
        RoIAlign(2, pool_mode="min")


def test_deform_roi_pool_module():
    m = DeformRoIPool(2, spatial_scale=0.5, sampling_ratio=2, gamma=0.3)
    assert (m.output_size, m.spatial_scale, m.sampling_ratio, m.gamma) == ((2, 2), 0.5, 2, 0.3)
    x = torch.randn(2, 3, 8, 8)
    rois = rand_rois(4, 2, 16, 16, dtype=torch.float32)
    offset = torch.randn(4, 2, 2, 2)
    torch.testing.assert_close(m(x, rois, offset), deform_roi_pool(x, rois, offset, 2, 0.5, 2, 0.3))
    torch.testing.assert_close(m(x, rois), deform_roi_pool(x, rois, None, 2, 0.5, 2, 0.3))


def test_pack_parameters_and_zero_init():
    m = DeformRoIPoolPack((2, 3), output_channels=4, deform_fc_channels=16, spatial_scale=0.5)
    shapes = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    assert shapes == {
        "offset_fc.0.weight": (16, 2 * 3 * 4), "offset_fc.0.bias": (16,),
        "offset_fc.2.weight": (16, 16), "offset_fc.2.bias": (16,),
        "offset_fc.4.weight": (2 * 3 * 2, 16), "offset_fc.4.bias": (2 * 3 * 2,),
    }
    assert torch.count_nonzero(m.offset_fc[-1].weight) == 0 and torch.count_nonzero(m.offset_fc[-1].bias) == 0
    x = torch.randn(2, 4, 8, 8)
    rois = rand_rois(3, 2, 16, 16, dtype=torch.float32)
    torch.testing.assert_close(m(x, rois), deform_roi_pool(x, rois, None, (2, 3), 0.5))
    with pytest.raises(ValueError, match="expected 4 channels"):
        m(torch.randn(2, 3, 8, 8), rois)


def test_modulated_pack_parameters_and_zero_init():
    m = ModulatedDeformRoIPoolPack(2, output_channels=3, deform_fc_channels=8)
    keys = set(m.state_dict())
    assert {"mask_fc.0.weight", "mask_fc.0.bias", "mask_fc.2.weight", "mask_fc.2.bias"} <= keys
    assert tuple(m.mask_fc[2].weight.shape) == (4, 8) and isinstance(m.mask_fc[3], torch.nn.Sigmoid)
    x = torch.randn(1, 3, 8, 8)
    rois = rand_rois(2, 1, 8, 8, dtype=torch.float32)
    # Zero offsets and a mask of sigmoid(0) = 0.5 at the start.
    torch.testing.assert_close(m(x, rois), 0.5 * deform_roi_pool(x, rois, None, 2))


@pytest.mark.parametrize("cls", [DeformRoIPoolPack, ModulatedDeformRoIPoolPack])
def test_pack_gradients_flow(cls):
    m = cls(2, output_channels=3, deform_fc_channels=8).double()
    with torch.no_grad():  # leave the zero init so that the offsets depend on the input
        m.offset_fc[-1].weight.normal_(0, 0.01)
    x = torch.randn(2, 3, 10, 10, dtype=torch.float64, requires_grad=True)
    rois = rand_rois(3, 2, 10, 10, inside=True)
    m(x, rois).square().sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0
    for name, p in m.named_parameters():
        assert p.grad is not None, name
    assert m.offset_fc[0].weight.grad.abs().sum() > 0
    assert m.offset_fc[-1].weight.grad.abs().sum() > 0


def test_deform_psroi_pool_module():
    m = DeformPSRoIPool(0.5, 3, 2, group_size=2, part_size=2, sample_per_part=2, trans_std=0.1)
    assert (m.spatial_scale, m.output_size, m.output_dim, m.group_size, m.part_size) == (0.5, 3, 2, 2, 2)
    assert (m.sample_per_part, m.trans_std, m.no_trans) == (2, 0.1, False)
    x = torch.randn(2, 8, 8, 8)
    rois = rand_rois(3, 2, 16, 16, dtype=torch.float32)
    trans = torch.randn(3, 2, 2, 2)
    torch.testing.assert_close(m(x, rois, trans), deform_psroi_pool(x, rois, trans, 0.5, 3, 2, 2, 2, 2, 0.1))
    n = DeformPSRoIPool(0.5, 3, 2, group_size=2, no_trans=True)
    assert n.part_size == 3
    torch.testing.assert_close(n(x, rois, trans), deform_psroi_pool(x, rois, None, 0.5, 3, 2, 2))


# ------------------------------------------------------------------------------------------------
# torch.compile and torch.export


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.align = RoIAlign(2, 0.5, 2, pool_mode="max")
        self.pack = DeformRoIPoolPack(2, 4, deform_fc_channels=8, spatial_scale=0.5)
        self.ps = DeformPSRoIPool(0.5, 2, 1, group_size=2, sample_per_part=2, trans_std=0.1)

    def forward(self, x, rois, trans):
        a = self.align(x, rois)
        b = self.pack(x, rois)
        c = self.ps(x, rois, trans)
        return a.sum(dim=1) + b.mean(dim=1) + c[:, 0]


def _inputs():
    x = torch.randn(2, 4, 8, 8)
    rois = rand_rois(3, 2, 16, 16, dtype=torch.float32)
    trans = torch.randn(3, 2, 2, 2)
    return x, rois, trans


def test_torch_compile_fullgraph():
    torch._dynamo.reset()
    net = _Net()
    x, rois, trans = _inputs()
    expected = net(x, rois, trans)
    compiled = torch.compile(net, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x, rois, trans), expected)
    # Backward through the compiled graph matches eager.
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
    net(xe, rois, trans).sum().backward()
    compiled(xc, rois, trans).sum().backward()
    torch.testing.assert_close(xc.grad, xe.grad)


def test_torch_export():
    net = _Net()
    x, rois, trans = _inputs()
    ep = torch.export.export(net, (x, rois, trans))
    targets = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert any("dcnkit.roi_align" in t for t in targets)
    assert any("dcnkit.deform_roi_pool" in t for t in targets)
    assert any("dcnkit.deform_psroi_pool" in t for t in targets)
    torch.testing.assert_close(ep.module()(x, rois, trans), net(x, rois, trans))
