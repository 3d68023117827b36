"""dcnkit.nn.DCNv3 / DCNv4: InternImage's and the DCNv4 package's parameter names and shapes (their checkpoints load
with strict=True), constructor arguments, defaults and checks, and the layers' forward against the published layers
written out with the grid_sample formulation (peer_dcn_layers)."""
import inspect

import pytest
import torch
import torch.nn.functional as F

from dcnkit.nn import DCNv3, DCNv4

from dcnv3_cases import grid_sample_dcnv3
from peer_dcn_layers import dcnv4_package, internimage_dcnv3, random_state

# The constructors' arguments, in order, with their defaults (InternImage ops_dcnv3/modules/dcnv3.py DCNv3, the DCNv4
# package's DCNv4/modules/dcnv4.py DCNv4).
INTERNIMAGE_DCNV3_ARGS = dict(channels=64, kernel_size=3, dw_kernel_size=None, stride=1, pad=1, dilation=1, group=4,
                              offset_scale=1.0, act_layer="GELU", norm_layer="LN", center_feature_scale=False,
                              remove_center=False)
PACKAGE_DCNV4_ARGS = dict(channels=64, kernel_size=3, stride=1, pad=1, dilation=1, group=4, offset_scale=1.0,
                          dw_kernel_size=None, center_feature_scale=False, remove_center=False, output_bias=True,
                          without_pointwise=False)


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


@pytest.mark.parametrize("cls,published", [(DCNv3, INTERNIMAGE_DCNV3_ARGS), (DCNv4, PACKAGE_DCNV4_ARGS)])
def test_constructor_arguments_and_defaults_are_the_published_ones(cls, published):
    params = inspect.signature(cls).parameters.values()
    assert [(p.name, p.default) for p in params if p.kind is p.POSITIONAL_OR_KEYWORD] == list(published.items())


def test_dcnv3_sub_modules_have_internimages_defaults():
    """InternImage's build_norm_layer / build_act_layer."""
    ln, bn = DCNv3(16, group=2).dw_conv[1][1], DCNv3(16, group=2, norm_layer="BN").dw_conv[1][0]
    assert (ln.eps, ln.elementwise_affine) == (1e-6, True)
    assert (bn.eps, bn.momentum, bn.affine, bn.track_running_stats) == (1e-5, 0.1, True, True)
    assert DCNv3(16, group=2).dw_conv[2].approximate == "none"
    assert DCNv3(16, group=2, act_layer="ReLU").dw_conv[2].inplace and DCNv3(16, group=2, act_layer="SiLU").dw_conv[2].inplace


@pytest.mark.parametrize("norm,act,cfs,rc", [("LN", "GELU", False, 0), ("LN", "SiLU", True, 1), ("BN", "ReLU", True, 0)])
def test_dcnv3_computes_internimages_layer(norm, act, cfs, rc):
    """A checkpoint gives InternImage's output, also on small inputs (where the LayerNorm's eps matters)."""
    layer = DCNv3(16, 3, group=4, norm_layer=norm, act_layer=act, center_feature_scale=cfs, remove_center=bool(rc),
                  offset_scale=0.9).double().eval()
    state = random_state(layer, seed=5)
    layer.load_state_dict(state, strict=True)
    gen = torch.Generator().manual_seed(6)
    for scale in (1.0, 1e-3):
        x = torch.randn(2, 6, 7, 16, generator=gen, dtype=torch.float64) * scale
        want = internimage_dcnv3(state, x, group=4, offset_scale=0.9, act_layer=act, norm_layer=norm,
                                 center_feature_scale=cfs, remove_center=rc)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("cfs,rc", [(True, 0), (True, 1), (False, 0)])
def test_dcnv4_computes_the_packages_layer(cfs, rc):
    """center_feature_scale: the package gates with the sampled output, not the layer's input."""
    layer = DCNv4(16, 3, group=2, center_feature_scale=cfs, remove_center=bool(rc), offset_scale=0.7).double()
    state = random_state(layer, seed=7)
    layer.load_state_dict(state, strict=True)
    x = torch.randn(2, 5 * 6, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    want = dcnv4_package(state, x, (5, 6), group=2, offset_scale=0.7, center_feature_scale=cfs, remove_center=rc)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, shape=(5, 6)), want, rtol=1e-9, atol=1e-12)


BAD_ARGS = [  # (keyword arguments, message); each a ValueError when the layer is built
    (dict(kernel_size=4, remove_center=True), r"remove_center: expected False with an even kernel_size = 4"),
    (dict(kernel_size=0), r"kernel_size: expected an int >= 1, got 0"),
    (dict(stride=2), r"stride: expected 1 \(the offsets are predicted at the input's resolution"),
    (dict(pad=0), r"pad: expected dilation \* \(kernel_size - 1\) / 2 = 1 \(the output keeps the input's size\), got 0"),
    (dict(dilation=2), r"pad: expected dilation \* \(kernel_size - 1\) / 2 = 2 .*got 1"),
    (dict(dilation=0), r"dilation: expected an int >= 1, got 0"),
    (dict(dw_kernel_size=4), r"dw_kernel_size: expected an odd int \(the depthwise conv keeps the map's size; .*\), got 4"),
    (dict(offset_scale=float("nan")), r"offset_scale: expected a finite number, got nan"),
    (dict(remove_center=2), r"remove_center: expected a bool, got 2"),
    (dict(channels=0), r"channels: expected an int >= 1, got 0"),
    (dict(group=2.0), r"group: expected an int >= 1, got 2.0"),
]


@pytest.mark.parametrize("cls", [DCNv3, DCNv4])
@pytest.mark.parametrize("kwargs,message", BAD_ARGS)
def test_bad_arguments_fail_when_the_layer_is_built(cls, kwargs, message):
    with pytest.raises(ValueError, match=f"{cls.__name__}: {message}"):
        cls(**{"channels": 16, "group": 2, **kwargs})


def test_layer_names_and_keywords_as_the_published_modules():
    for kwargs in (dict(norm_layer="GN"), dict(act_layer="PReLU")):  # InternImage: NotImplementedError
        with pytest.raises(NotImplementedError, match=f"DCNv3: {next(iter(kwargs))}: expected"):
            DCNv3(16, group=2, **kwargs)
    with pytest.warns(UserWarning, match=r"DCNv3: channels / group = 6 is not a power of 2"):
        DCNv3(12, group=2)
    # What InternImage-style blocks pass to any core op is accepted and unused by DCNv4 (as in the package)...
    layer = DCNv4(16, group=2, act_layer="GELU", norm_layer="LN")
    assert set(layer.state_dict()) == set(DCNv4(16, group=2).state_dict())
    with pytest.raises(TypeError, match=r"DCNv4: unexpected keyword argument\(s\) 'center_featur_scale'"):
        DCNv4(16, group=2, center_featur_scale=True)  # ...a misspelling is not
