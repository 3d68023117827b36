"""Imported by ``import dcnkit``: plain ``torch.onnx.export`` then handles the dcnkit operators, with
both the dynamo exporter (the default) and the TorchScript one. Cheap: onnx / onnxscript are not
imported here."""
from dcnkit.export import _dynamo, _legacy

_legacy.register()
_dynamo.register()
