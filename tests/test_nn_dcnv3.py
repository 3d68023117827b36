"""dcnkit.nn.DCNv3 / DCNv4: InternImage's and the DCNv4 package's parameter names and shapes (their checkpoints load
with strict=True), and the layers' forward against the same layer written with the grid_sample formulation."""
import pytest
import torch
import torch.nn.functional as F

from dcnkit.nn import DCNv3, DCNv4

from dcnv3_cases import grid_sample_dcnv3


def _published_dcnv3_state(c=16, g=4, k=3, rc=0, norm="LN", cfs=False):
    """The keys and shapes of InternImage's DCNv3 (ops_dcnv3/modules/dcnv3.py) state dict."""
    p = g * (k * k - rc)
    state = {"dw_conv.0.weight": (c, 1, k, k), "dw_conv.0.bias": (c,), "offset.weight": (p * 2, c),
             "offset.bias": (p * 2,), "mask.weight": (p, c), "mask.bias": (p,), "input_proj.weight": (c, c),
             "input_proj.bias": (c,), "output_proj.weight": (c, c), "output_proj.bias": (c,)}
    if norm == "LN":
        state.update({"dw_conv.1.1.weight": (c,), "dw_conv.1.1.bias": (c,)})
    else:
        state.update({f"dw_conv.1.0.{n}": (c,) for n in ("weight", "bias", "running_mean", "running_var")})
        state["dw_conv.1.0.num_batches_tracked"] = ()
    if cfs:
        state.update({"center_feature_scale_proj_weight": (g, c), "center_feature_scale_proj_bias": (g,)})
    gen = torch.Generator().manual_seed(0)
    out = {key: (torch.randn(shape, generator=gen) * 0.3 if shape else torch.tensor(3)) for key, shape in state.items()}
    if "dw_conv.1.0.running_var" in out:
        out["dw_conv.1.0.running_var"] = out["dw_conv.1.0.running_var"].abs() + 0.5
    return out


@pytest.mark.parametrize("norm,rc,cfs", [("LN", 0, False), ("BN", 1, True)])
def test_dcnv3_loads_internimage_checkpoints_and_matches_grid_sample(norm, rc, cfs):
    layer = DCNv3(16, 3, group=4, norm_layer=norm, remove_center=bool(rc), center_feature_scale=cfs, offset_scale=0.9)
    state = _published_dcnv3_state(norm=norm, rc=rc, cfs=cfs)
    layer.load_state_dict(state, strict=True)
    layer.eval()
    x = torch.randn(2, 6, 7, 16, generator=torch.Generator().manual_seed(1))
    # The same layer written out with the grid_sample formulation of the op.
    with torch.no_grad():
        v = layer.input_proj(x)
        x1 = layer.dw_conv(x.permute(0, 3, 1, 2))
        off = layer.offset(x1)
        m = F.softmax(layer.mask(x1).reshape(2, 6, 7, 4, -1), -1).reshape(2, 6, 7, -1)
        y = grid_sample_dcnv3(v.double(), off.double(), m.double(), 3, 3, 1, 1, 1, 1, 1, 1, 4, 4, 0.9, rc).float()
        if cfs:
            s = F.linear(x1, state["center_feature_scale_proj_weight"], state["center_feature_scale_proj_bias"])
            s = s.sigmoid()[..., None].repeat(1, 1, 1, 1, 4).flatten(-2)
            y = y * (1 - s) + v * s
        want = layer.output_proj(y)
        torch.testing.assert_close(layer(x), want, rtol=1e-4, atol=1e-4)


def test_dcnv4_loads_the_packages_checkpoints_and_matches_dcnv3_data():
    c, g, k = 16, 4, 3
    cp = (g * k * k * 3 + 7) // 8 * 8
    assert cp == 112
    layer = DCNv4(c, k, group=g, dw_kernel_size=3)
    gen = torch.Generator().manual_seed(2)
    state = {"offset_mask_dw.weight": (c, 1, 3, 3), "offset_mask_dw.bias": (c,), "offset_mask.weight": (cp, c),
             "offset_mask.bias": (cp,), "value_proj.weight": (c, c), "value_proj.bias": (c,),
             "output_proj.weight": (c, c), "output_proj.bias": (c,)}
    layer.load_state_dict({key: torch.randn(s, generator=gen) * 0.3 for key, s in state.items()}, strict=True)
    x = torch.randn(2, 5 * 6, c, generator=gen)
    y = layer(x, shape=(5, 6))
    assert y.shape == (2, 30, c)
    with torch.no_grad():
        v = layer.value_proj(x).reshape(2, 5, 6, c)
        om = layer.offset_mask(layer.offset_mask_dw(x.reshape(2, 5, 6, c).permute(0, 3, 1, 2)).permute(0, 2, 3, 1))
        per = om[..., :g * 27].reshape(2, 5, 6, g, 27)
        off, m = per[..., :18].reshape(2, 5, 6, -1), per[..., 18:].reshape(2, 5, 6, -1)  # weights used as given
        want = grid_sample_dcnv3(v.double(), off.double(), m.double(), 3, 3, 1, 1, 1, 1, 1, 1, g, c // g, 1.0).float()
        want = layer.output_proj(want.reshape(2, 30, c))
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)
    assert set(DCNv4(c, k, group=g, without_pointwise=True).state_dict()) == {"offset_mask.weight", "offset_mask.bias"}


def test_module_arguments_are_checked_and_gradients_flow():
    with pytest.raises(ValueError, match=r"DCNv3: group: expected an int >= 1 dividing channels = 16, got 3"):
        DCNv3(16, group=3)
    with pytest.raises(ValueError, match=r"DCNv3: norm_layer: expected 'LN' or 'BN', got 'GN'"):
        DCNv3(16, norm_layer="GN")
    with pytest.raises(ValueError, match=r"DCNv4: shape: expected \(H, W\) with H\*W = L = 30, got \(5, 5\)"):
        DCNv4(16)(torch.randn(1, 30, 16), shape=(5, 5))
    layer = DCNv3(8, group=2)
    x = torch.randn(1, 5, 5, 8, requires_grad=True)
    layer(x).sum().backward()
    assert x.grad is not None and layer.offset.weight.grad is not None and layer.mask.weight.grad is not None
