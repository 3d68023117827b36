"""Checks shared by the detector examples' tests (tests/test_faster_rcnn_dcn.py, tests/test_rfcn_dcn.py)."""
from __future__ import annotations

import importlib.util

import numpy as np


def assert_empty_on_every_backend(ex, model, path, blank) -> None:
    """``blank`` (an image without proposals) gives empty ``boxes/labels/scores`` in eager PyTorch, ONNX Runtime, the
    reference runner and, where the [openvino] extra is installed (scripts/setup.sh installs it), OpenVINO."""
    results = [("eager", ex.eager_detections(model, blank)), ("ort-cpu", ex.ort_detections(path, blank)),
               ("reference", ex.reference_detections(path, blank))]
    if importlib.util.find_spec("openvino") is not None:
        results.append(("openvino", ex.runner_detections(path, blank, "openvino")))
    for backend, got in results:
        assert {k: (got[k].shape, got[k].dtype) for k in ex.OUTPUTS} == {
            "boxes": ((0, 4), np.float32), "labels": ((0,), np.int64), "scores": ((0,), np.float32)}, backend


def unread_initializers(path) -> list[str]:
    """The initializers of the ONNX file at ``path`` that no node reads (ONNX Runtime warns about each one at every
    session start)."""
    import onnx

    graph = onnx.load(str(path)).graph
    read = {i for n in graph.node for i in n.input}
    return [t.name for t in graph.initializer if t.name not in read]
