"""dcnkit.runtime.registry: a backend is one module that declares it plus one line in the registry's table."""
from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest

from dcnkit.runtime import registry
from dcnkit.runtime.base import Backend, BackendUnavailable

FAKE_BACKEND = textwrap.dedent('''
    import numpy as np

    from dcnkit.runtime.base import Backend, BackendUnavailable, Runner, TensorInfo


    class DoublingRunner(Runner):
        name = "doubling"

        def __init__(self, model, scale=2.0):
            self.model, self.scale = model, scale

        def inputs(self):
            return [TensorInfo("x", np.dtype(np.float32), ("N",))]

        def outputs(self):
            return [TensorInfo("y", np.dtype(np.float32), ("N",))]

        def run(self, feeds):
            return {"y": self._check_feeds(feeds)["x"] * self.scale}


    def _runner(model, kit_kernels=True, **options):
        return DoublingRunner(model, **options)


    def _never(model, kit_kernels=True, **options):
        raise BackendUnavailable("missing: no such device here")


    BACKENDS = (Backend("doubling", lambda: None, _runner), Backend("missing", lambda: "no such device here", _never))
''')


@pytest.fixture
def fake_backends(tmp_path, monkeypatch):
    (tmp_path / "dcnkit_test_fake_backend.py").write_text(FAKE_BACKEND)
    monkeypatch.syspath_prepend(str(tmp_path))
    modules = dict(registry._MODULES, doubling="dcnkit_test_fake_backend", missing="dcnkit_test_fake_backend",
                   broken="dcnkit_test_no_such_module")
    monkeypatch.setattr(registry, "_MODULES", modules)
    monkeypatch.setattr(registry, "BACKENDS", tuple(modules))
    yield
    sys.modules.pop("dcnkit_test_fake_backend", None)


def test_a_declared_backend_runs_through_make_runner(fake_backends):
    with registry.make_runner("any.onnx", "doubling", scale=3.0) as r:
        out = r.run({"x": np.arange(4, dtype=np.float64)})
    np.testing.assert_array_equal(out["y"], np.array([0, 3, 6, 9], dtype=np.float32))
    assert out["y"].dtype == np.float32
    assert registry.check_backend("doubling") == "doubling"


def test_availability_comes_from_the_declaration_and_import_errors_are_reasons(fake_backends):
    avail = registry.available_backends()
    assert list(avail)[:4] == ["ort-cpu", "ort-cuda", "tensorrt", "reference"]
    assert avail["doubling"] is None
    assert avail["missing"] == "no such device here"
    assert avail["broken"].startswith("dcnkit_test_no_such_module cannot be imported (ModuleNotFoundError: ")
    with pytest.raises(BackendUnavailable, match="^missing: no such device here$"):
        registry.make_runner("any.onnx", "missing")


def test_the_cli_lists_a_declared_backend(fake_backends, capsys):
    from dcnkit.cli import main

    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "doubling   available" in out and "missing    unavailable: no such device here" in out


def test_unknown_names_and_undeclared_names_are_errors(monkeypatch):
    with pytest.raises(ValueError, match=r"^backend: expected one of ort-cpu, ort-cuda, tensorrt, reference, "
                                         r"openvino, got 'tvm'$"):
        registry.make_runner("m.onnx", "tvm")
    monkeypatch.setattr(registry, "_MODULES", dict(registry._MODULES, extra="dcnkit.runtime.ort_runner"))
    monkeypatch.setattr(registry, "BACKENDS", tuple(registry._MODULES))
    with pytest.raises(LookupError, match="does not declare the backend 'extra'"):
        registry.backend_declaration("extra")


def test_the_shipped_backends_are_declared_by_their_modules():
    for name in registry.BACKENDS:
        declared = registry.backend_declaration(name)
        assert isinstance(declared, Backend) and declared.name == name
    assert registry.backend_declaration("ort-cpu").unavailable_reason() is None
    assert registry.backend_declaration("reference").unavailable_reason() is None
