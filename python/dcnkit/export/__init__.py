"""ONNX export of models that use dcnkit's operators.

After ``import dcnkit``, plain ``torch.onnx.export(model, args, path)`` works with ``dynamo=True``
(the default) and ``dynamo=False``. Each op becomes a standard ONNX op where the semantics are
identical (``deform_conv2d`` -> ``DeformConv`` from opset 19, ``roi_align`` avg -> ``RoiAlign``),
otherwise a node of the ``dcnkit`` domain (opset 1; op types, input order and attribute names from
``dcnkit.op_defs()``). ``with dcnkit.export.custom_ops_only():`` (or ``standard_ops(False)``) makes
every op a ``dcnkit`` node.

``to_onnx`` wraps the export with argument checks, dynamic batch / RoI-count axes, the checker and
strict shape inference. ``register_onnx_schemas`` makes onnx itself know the ``dcnkit`` domain.

Importing this package does not import torch (``dcnkit.export.schemas`` serves the deployment side too);
the names that need it (``standard_ops`` ...) load on first use, and ``to_onnx`` imports it when called.
"""
from dcnkit.export._onnx import check_model, lower_ir_version, to_onnx
from dcnkit.export.schemas import register_onnx_schemas

_LOWERING_NAMES = ("custom_ops_only", "set_standard_ops", "standard_ops", "standard_ops_enabled")


def __getattr__(name: str):
    if name in _LOWERING_NAMES:
        from dcnkit.export import _lowering

        return getattr(_lowering, name)
    raise AttributeError(f"module 'dcnkit.export' has no attribute {name!r}")


def domain() -> str:
    """The custom ONNX domain of dcnkit's nodes (``"dcnkit"``)."""
    from dcnkit.export import _table

    return _table.domain()


def domain_opset() -> int:
    """The version of the custom domain (1)."""
    from dcnkit.export import _table

    return _table.opset()


__all__ = [
    "to_onnx",
    "check_model",
    "lower_ir_version",
    "register_onnx_schemas",
    "standard_ops",
    "custom_ops_only",
    "set_standard_ops",
    "standard_ops_enabled",
    "domain",
    "domain_opset",
]
