"""Hugging Face transformers' deformable-attention models built offline from their configs (random weights, no
download), small or at their default sizes: what the integration's tests, benchmarks/bench_transformers.py and
examples/hf_rt_detr.py run.

    build(family, size="small", seed=0) -> (model in eval mode, inputs: dict of keyword tensors)

Families (FAMILIES): deformable_detr, rt_detr, grounding_dino, mm_grounding_dino, omdet_turbo, lw_detr,
mask2former, oneformer, rt_detr_v2, d_fine, deimv2. ``size="small"`` is a narrow model (few layers, d_model 32-64)
on a 96x96 image, built in well under a second; ``size="default"`` is the family's default config (ResNet-50-like
or its own backbone) on a 320x320 image, as benchmarks/bench_transformers.py times them.
"""
from __future__ import annotations

import torch

FAMILIES = ("deformable_detr", "rt_detr", "grounding_dino", "mm_grounding_dino", "omdet_turbo", "lw_detr",
            "mask2former", "oneformer", "rt_detr_v2", "d_fine", "deimv2")
# The three the acceptance names, and the call site each family uses.
MAIN = ("deformable_detr", "rt_detr", "mask2former")
SITE = {"deformable_detr": "MultiScaleDeformableAttention", "rt_detr": "MultiScaleDeformableAttention",
        "grounding_dino": "MultiScaleDeformableAttention", "mm_grounding_dino": "MultiScaleDeformableAttention",
        "omdet_turbo": "MultiScaleDeformableAttention", "lw_detr": "MultiScaleDeformableAttention",
        "mask2former": "multi_scale_deformable_attention", "oneformer": "multi_scale_deformable_attention",
        "rt_detr_v2": "multi_scale_deformable_attention_v2", "d_fine": "ms_deformable_attn_core",
        "deimv2": "ms_deformable_attn_core"}


def _resnet(small: bool, out_features=("stage2", "stage3", "stage4")):
    from transformers import ResNetConfig

    if small:
        return ResNetConfig(embedding_size=16, hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1],
                            layer_type="basic", out_features=list(out_features))
    return ResNetConfig(out_features=list(out_features))


def _image(size: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 1)
    return torch.rand(1, 3, size, size, generator=g) * 2 - 1


def _deformable_detr(small):
    from transformers import DeformableDetrConfig, DeformableDetrForObjectDetection

    kw = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
              encoder_attention_heads=4, decoder_attention_heads=4, num_queries=20) if small else {}
    cfg = DeformableDetrConfig(use_timm_backbone=False, use_pretrained_backbone=False,
                               backbone_config=_resnet(small), **kw)
    return DeformableDetrForObjectDetection(cfg)


def _rt_detr_kw(small):
    if not small:
        return {}
    return dict(encoder_hidden_dim=32, encoder_in_channels=[32, 48, 64], d_model=32, encoder_ffn_dim=64,
                decoder_ffn_dim=64, encoder_attention_heads=4, decoder_attention_heads=4, decoder_layers=2,
                decoder_in_channels=[32, 32, 32], num_queries=20, num_denoising=0)


def _rt_detr(small):
    from transformers import RTDetrConfig, RTDetrForObjectDetection

    return RTDetrForObjectDetection(RTDetrConfig(backbone_config=_resnet(small, ("stage2", "stage3", "stage4")),
                                                 **_rt_detr_kw(small)))


def _rt_detr_v2(small):
    from transformers import RTDetrV2Config, RTDetrV2ForObjectDetection

    return RTDetrV2ForObjectDetection(RTDetrV2Config(backbone_config=_resnet(small), **_rt_detr_kw(small)))


def _d_fine(small, cls_name="DFine"):
    import transformers

    cfg_cls = getattr(transformers, f"{cls_name}Config")
    model_cls = getattr(transformers, f"{cls_name}ForObjectDetection")
    kw = _rt_detr_kw(small)
    if small:
        # Different point counts per level (D-FINE's n_points may be a list): the v2 layout's hard case.
        kw.update(decoder_n_points=[3, 2, 4], num_feature_levels=3)
    return model_cls(cfg_cls(backbone_config=_resnet(small), **kw))


def _mask2former(small):
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation

    kw = dict(feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=64, encoder_layers=2,
              decoder_layers=3, num_attention_heads=4, dim_feedforward=64, num_queries=10) if small else {}
    cfg = Mask2FormerConfig(backbone_config=_resnet(small, ("stage1", "stage2", "stage3", "stage4")), **kw)
    return Mask2FormerForUniversalSegmentation(cfg)


def _fill_zero_parameters(model: torch.nn.Module, seed: int) -> None:
    """Small random values in the parameters the families initialise to zero (D-FINE's and DEIMv2's decoder
    heads and gates, offsets' weights): otherwise a difference in the attention would not reach the outputs."""
    g = torch.Generator().manual_seed(seed + 2)
    with torch.no_grad():
        for p in model.parameters():
            if p.numel() and not p.any():
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _grounding_dino(small, prefix="GroundingDino"):
    import transformers
    from transformers import BertConfig

    text = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=64) if small else None
    kw = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64,
              encoder_attention_heads=4, decoder_attention_heads=4, num_queries=20, max_text_len=16) if small else {}
    cfg = getattr(transformers, f"{prefix}Config")(backbone_config=_resnet(small), text_config=text, **kw)
    return getattr(transformers, f"{prefix}ForObjectDetection")(cfg)


def _oneformer(small):
    from transformers import OneFormerConfig, OneFormerForUniversalSegmentation

    kw = dict(conv_dim=32, mask_dim=32, hidden_dim=32, encoder_feedforward_dim=64, encoder_layers=2,
              decoder_layers=3, num_attention_heads=4, dim_feedforward=64, num_queries=10, text_encoder_width=32,
              text_encoder_num_layers=1, text_encoder_context_length=8, task_seq_len=8,
              text_encoder_vocab_size=100) if small else {}
    cfg = OneFormerConfig(backbone_config=_resnet(small, ("stage1", "stage2", "stage3", "stage4")),
                          is_training=False, **kw)
    return OneFormerForUniversalSegmentation(cfg)


def _text_inputs(family: str, model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed + 3)
    if family in ("grounding_dino", "mm_grounding_dino"):
        ids = torch.randint(1, 100, (1, 6), generator=g)
        ids[0, 0], ids[0, -1], ids[0, 3] = 101 % 100, 102 % 100, 1012 % 100  # [CLS]-like, [SEP]-like, "."-like
        return {"input_ids": ids}
    if family == "oneformer":
        return {"task_inputs": torch.randint(1, 100, (1, model.config.task_seq_len), generator=g)}
    return {}


_BUILDERS = {"deformable_detr": _deformable_detr, "rt_detr": _rt_detr, "rt_detr_v2": _rt_detr_v2,
             "d_fine": _d_fine, "deimv2": lambda small: _d_fine(small, "Deimv2"), "mask2former": _mask2former,
             "grounding_dino": _grounding_dino, "mm_grounding_dino": lambda small: _grounding_dino(small, "MMGroundingDino"),
             "oneformer": _oneformer}


def build(family: str, size: str = "small", seed: int = 0) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """``(model, inputs)``: the family's model (eval mode, random weights from ``seed``) and its keyword inputs."""
    if family not in _BUILDERS:
        raise ValueError(f"hf_models.build: family: expected one of {sorted(_BUILDERS)}, got {family!r}")
    if size not in ("small", "default"):
        raise ValueError(f"hf_models.build: size: expected 'small' or 'default', got {size!r}")
    small = size == "small"
    torch.manual_seed(seed)
    model = _BUILDERS[family](small).eval()
    _fill_zero_parameters(model, seed)
    return model, {"pixel_values": _image(96 if small else 320, seed), **_text_inputs(family, model, seed)}
