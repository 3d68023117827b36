"""Running exported models: ONNX Runtime sessions with the kit's ops, backend runners, engine builders."""
from dcnkit.runtime.ort import ort_session  # noqa: F401

__all__ = ["ort_session"]
