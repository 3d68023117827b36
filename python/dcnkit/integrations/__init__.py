"""Ready-made bridges between other libraries' models and dcnkit's operators.

``dcnkit.integrations.transformers``: Hugging Face transformers' deformable-attention models (Deformable DETR,
RT-DETR, Grounding DINO, Mask2Former, OneFormer, RT-DETR v2, D-FINE, ...) on the kit's operator with
``patch(model)`` (docs/transformers.md). Importing this package imports nothing else.
"""
