"""Polygraphy extension: ``polygraphy run`` with the kit's operators.

Registered through Polygraphy's extension entry point (group ``polygraphy.run.plugins`` in ``pyproject.toml``;
the entry point is :func:`arg_groups`, which returns argument groups). With dcnkit installed,
``polygraphy run`` gains:

``--dcnkit`` (alias ``--dcnkit-ops``)
    ONNX-Runtime sessions of ``--onnxrt`` register the kit's custom-op library (``dcnkit.ort_library()``),
    so models with ``dcnkit``-domain nodes (every operator of the kit's table, ``dcnkit.op_defs()``) and the names
    mmdeploy / mmcv export load.
``--dcnkit-reference``
    A runner: the whole model in ``onnx.reference`` with the kit's slow NumPy references for the kit's nodes (every
    name of every operator of the table, and standard ``DeformConv`` / ``RoiAlign``); see
    :mod:`dcnkit.runtime.reference_runner`.

Example::

    polygraphy run model.onnx --onnxrt --dcnkit --dcnkit-reference --atol 1e-4 --rtol 1e-4

From Python, without the CLI: ``OnnxrtRunner(lambda: dcnkit.runtime.ort_session("model.onnx"))`` or
``OnnxrtRunner(SessionFromOnnxWithDcnkit("model.onnx"))``, and ``PolygraphyReferenceRunner("model.onnx")``.
See docs/polygraphy.md.
"""
from __future__ import annotations

import os

from polygraphy import util
from polygraphy.backend.onnxrt import SessionFromOnnx
from polygraphy.logger import G_LOGGER
from polygraphy.tools.args import util as args_util
from polygraphy.tools.args.backend.onnx.loader import OnnxLoadArgs
from polygraphy.tools.args.backend.onnxrt.loader import OnnxrtSessionArgs
from polygraphy.tools.args.base import BaseArgs, BaseRunnerArgs
from polygraphy.tools.args.model import ModelArgs
from polygraphy.tools.script import inline, inline_identifier, make_invocable, safe

from dcnkit import _polygraphy_torch

_polygraphy_torch.install()  # Polygraphy's torch checks do not import torch (the deployment side runs without)


class SessionFromOnnxWithDcnkit(SessionFromOnnx):
    """Polygraphy ``SessionFromOnnx`` whose session registers the kit's ONNX Runtime library."""

    @util.check_called_by("__call__")
    def call_impl(self):
        import onnxruntime as ort

        from dcnkit.runtime.ort_runner import _make_ort_session

        model, _ = util.invoke_if_callable(self._model_bytes_or_path)
        available = ort.get_available_providers()
        providers = []
        for prov in self.providers:
            name = prov[0] if isinstance(prov, tuple) else prov
            match = util.find_str_in_iterable(name, available)
            if match is None:
                G_LOGGER.critical(
                    f"--providers: expected one of {available}, got {name!r}"
                )
            providers.append((match, prov[1]) if isinstance(prov, tuple) else match)
        options = {}
        try:
            options["intra_op_num_threads"] = len(os.sched_getaffinity(0))
        except AttributeError:  # pragma: no cover - not UNIX
            pass
        if self.graph_optimization_level is not None:
            options["graph_optimization_level"] = self.graph_optimization_level
        G_LOGGER.start(f"Creating ONNX-Runtime session with the dcnkit library, providers: {providers}")
        return _make_ort_session(model, providers, **options)


class DcnkitArgs(BaseArgs):
    """
    dcnkit: the deformable-convolution / RoI pooling kit's operators in ONNX-Runtime sessions.

    Depends on:

        - OnnxrtSessionArgs
        - OnnxLoadArgs
        - ModelArgs
    """

    def add_parser_args_impl(self):
        self.group.add_argument(
            "--dcnkit",
            "--dcnkit-ops",
            dest="dcnkit_ops",
            action="store_true",
            default=False,
            help="Register the dcnkit ONNX Runtime custom-op library (dcnkit.ort_library()) in the sessions of "
            "--onnxrt, so that models with dcnkit-domain nodes (the operators of dcnkit.op_defs()) and the names "
            "mmdeploy / mmcv export load. Compare with --dcnkit-reference.",
        )

    def parse_impl(self, args):
        """
        Attributes:
            enabled (bool): Whether ONNX-Runtime sessions register the dcnkit library.
        """
        self.enabled = bool(args_util.get(args, "dcnkit_ops"))
        if self.enabled and OnnxrtSessionArgs in self.arg_groups:
            sess_args = self.arg_groups[OnnxrtSessionArgs]
            # The ORT session loader of `--onnxrt` becomes ours (also in --gen-script output).
            sess_args.add_to_script_impl = _session_script_adder(sess_args)

    def add_to_script_impl(self, script):  # pragma: no cover - nothing to add on its own
        return None


def _session_script_adder(sess_args):
    def add_to_script_impl(script, onnx_name=None):
        if onnx_name is None:
            if sess_args.arg_groups[OnnxLoadArgs].must_use_onnx_loader():
                onnx_name = sess_args.arg_groups[OnnxLoadArgs].add_to_script(script, serialize_model=True)
            else:
                onnx_name = sess_args.arg_groups[ModelArgs].path
        script.add_import(imports=["SessionFromOnnxWithDcnkit"], frm="dcnkit.polygraphy_ext")
        level = None
        if sess_args.graph_optimization_level is not None:
            script.add_import(imports=["onnxruntime"], imp_as="onnxrt")
            level = inline(
                safe("onnxrt.GraphOptimizationLevel.{:}", inline_identifier(sess_args.graph_optimization_level))
            )
        return script.add_loader(
            make_invocable(
                "SessionFromOnnxWithDcnkit", onnx_name, providers=sess_args.providers, graph_optimization_level=level
            ),
            "build_onnxrt_session_dcnkit",
        )

    return add_to_script_impl


class DcnkitReferenceRunnerArgs(BaseRunnerArgs):
    """
    dcnkit Reference Inference: the whole model in onnx.reference with dcnkit's NumPy references.

    Depends on:

        - OnnxLoadArgs
    """

    def get_name_opt_impl(self):
        return "dcnkit NumPy reference", "dcnkit-reference"

    def get_extra_help_text_impl(self):
        return (
            "Slow and independent of ONNX Runtime: onnx.reference for standard nodes, dcnkit.reference for "
            "every name of every operator of dcnkit.op_defs() and standard DeformConv/RoiAlign."
        )

    def add_to_script_impl(self, script):
        script.add_import(imports=["PolygraphyReferenceRunner"], frm="dcnkit.runtime.reference_runner")
        onnx_name = self.arg_groups[OnnxLoadArgs].add_to_script(script)
        script.add_runner(make_invocable("PolygraphyReferenceRunner", onnx_name))


def polygraphy_runner(model, backend: str, name: str | None = None, **options):
    """A Polygraphy ``BaseRunner`` for one of the kit's backends.

    ``ort-*``: Polygraphy's own ``OnnxrtRunner`` over a session with the kit's library; ``reference``:
    :class:`~dcnkit.runtime.reference_runner.PolygraphyReferenceRunner`; other backends: an adapter over
    :func:`~dcnkit.runtime.registry.make_runner`. The session / engine is created when the runner activates.
    """
    from polygraphy.backend.onnxrt import OnnxrtRunner

    from dcnkit.runtime import registry as R
    from dcnkit.runtime.reference_runner import PolygraphyReferenceRunner

    R.check_backend(backend)
    name = name or backend
    if backend in ("ort-cpu", "ort-cuda"):
        return OnnxrtRunner(lambda: R.make_runner(model, backend, **options).session, name=name)
    if backend == "reference":
        return PolygraphyReferenceRunner(model, name=name)
    return _adapter_class()(model, backend, name=name, **options)


def _adapter_class():
    from collections import OrderedDict
    import time

    from polygraphy.backend.base import BaseRunner
    from polygraphy.common import TensorMetadata

    class DcnkitRunner(BaseRunner):
        def __init__(self, model, backend, name=None, **options):
            super().__init__(name=name, prefix=f"dcnkit-{backend}-runner")
            self._args = (model, backend, options)

        def activate_impl(self):
            from dcnkit.runtime.registry import make_runner

            model, backend, options = self._args
            self._runner = make_runner(model, backend, **options)

        def get_input_metadata_impl(self):
            meta = TensorMetadata()
            for i in self._runner.inputs():
                meta.add(i.name, dtype=i.dtype, shape=[d if d is not None else -1 for d in i.shape])
            return meta

        def infer_impl(self, feed_dict):
            start = time.time()
            out = self._runner.run({k: util.array.to_numpy(v) for k, v in feed_dict.items()})
            self.inference_time = time.time() - start
            return OrderedDict(out)

        def deactivate_impl(self):
            self._runner.close()
            del self._runner

    return DcnkitRunner


def error_stats(results, reference_index: int = 0) -> list[dict]:
    """Per output and runner pair (each runner vs the runner at ``reference_index``) over all iterations:
    ``max_abs``, ``mean_abs``, ``max_rel``, ``mean_rel`` (relative to |reference|, zeros skipped)."""
    import numpy as np

    names = [r[0] for r in results]
    ref_name, ref_iters = results[reference_index]
    rows = []
    for i, (name, iters) in enumerate(results):
        if i == reference_index:
            continue
        per_out: dict[str, list] = {}
        for it_ref, it in zip(ref_iters, iters):
            for out_name in it_ref.keys():
                if out_name not in it:
                    continue
                a = util.array.to_numpy(it[out_name]).astype(np.float64)
                b = util.array.to_numpy(it_ref[out_name]).astype(np.float64)
                if a.shape != b.shape:
                    per_out.setdefault(out_name, []).append(None)
                    continue
                per_out.setdefault(out_name, []).append((a, b))
        for out_name, pairs in per_out.items():
            if any(p is None for p in pairs):
                rows.append(dict(output=out_name, runner=name, reference=ref_name, shape_mismatch=True))
                continue
            diff = np.concatenate([np.abs(a - b).ravel() for a, b in pairs])
            mag = np.concatenate([np.abs(b).ravel() for a, b in pairs])
            nz = mag > 0
            rel = diff[nz] / mag[nz]
            rows.append(
                dict(
                    output=out_name,
                    runner=name,
                    reference=ref_name,
                    max_abs=float(diff.max()) if diff.size else 0.0,
                    mean_abs=float(diff.mean()) if diff.size else 0.0,
                    max_rel=float(rel.max()) if rel.size else 0.0,
                    mean_rel=float(rel.mean()) if rel.size else 0.0,
                    nan=bool(np.isnan(diff).any()),
                )
            )
    del names
    return rows


def compare_backends(model, backends, feeds, atol=1e-5, rtol=1e-5, quiet: bool = True):
    """Runs ``model`` on ``backends`` (names) with ``feeds`` (a list of feed dicts) through Polygraphy's
    ``Comparator.run`` and checks every backend against the first with ``CompareFunc.simple(atol, rtol)``.
    ``atol`` / ``rtol`` are a float for every output or, as in Polygraphy, a dict of per-output values with
    the key ``""`` for the default (e.g. ``{"": 1e-4, "boxes": 0.05}``).

    Returns ``(passed, stats, results)``: ``passed`` is Polygraphy's verdict (bool), ``stats`` the rows of
    :func:`error_stats`, ``results`` Polygraphy's ``RunResults``.
    """
    from polygraphy.comparator import Comparator

    try:  # Polygraphy >= 0.53: the class behind the deprecated CompareFunc.simple
        from polygraphy.comparator import SimpleCompareFunc as _simple
    except ImportError:  # pragma: no cover - older Polygraphy
        from polygraphy.comparator import CompareFunc

        _simple = CompareFunc.simple
    runners = [polygraphy_runner(model, b, name=b) for b in backends]
    import contextlib

    with G_LOGGER.verbosity(G_LOGGER.ERROR) if quiet else contextlib.nullcontext():
        results = Comparator.run(runners, data_loader=list(feeds))
        accuracy = Comparator.compare_accuracy(
            results,
            compare_func=_simple(atol=atol, rtol=rtol),
            comparisons=[(0, i) for i in range(1, len(runners))],
        )
    return bool(accuracy), error_stats(results), results


def arg_groups():
    """Entry point of the ``polygraphy.run.plugins`` group: the argument groups this extension adds."""
    return [DcnkitArgs(), DcnkitReferenceRunnerArgs()]


__all__ = [
    "arg_groups",
    "DcnkitArgs",
    "DcnkitReferenceRunnerArgs",
    "SessionFromOnnxWithDcnkit",
    "polygraphy_runner",
    "compare_backends",
    "error_stats",
]
