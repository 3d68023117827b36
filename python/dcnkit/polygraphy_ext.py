"""Polygraphy extension: ``polygraphy run`` with the kit's operators.

Registered through Polygraphy's extension entry point (group ``polygraphy.run.plugins`` in ``pyproject.toml``;
the entry point is :func:`arg_groups`, which returns argument groups). With dcnkit installed,
``polygraphy run`` gains:

``--dcnkit`` (alias ``--dcnkit-ops``)
    ONNX-Runtime sessions of ``--onnxrt`` register the kit's custom-op library (``dcnkit.ort_library()``),
    so models with ``dcnkit``-domain nodes (DeformConv2d, RoIAlign, DeformRoIPool, DeformPSRoIPool) load.
``--dcnkit-reference``
    A runner: the whole model in ``onnx.reference`` with the kit's slow NumPy references for the deformable /
    RoI nodes (custom and standard ``DeformConv`` / ``RoiAlign``); see :mod:`dcnkit.runtime.reference_runner`.

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


class SessionFromOnnxWithDcnkit(SessionFromOnnx):
    """Polygraphy ``SessionFromOnnx`` whose session registers the kit's ONNX Runtime library."""

    @util.check_called_by("__call__")
    def call_impl(self):
        import onnxruntime as ort

        from dcnkit.runtime.runners import _make_ort_session

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
            "--onnxrt, so that models with dcnkit-domain nodes (DeformConv2d, RoIAlign, DeformRoIPool, "
            "DeformPSRoIPool) load. Compare with --dcnkit-reference.",
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
            "DeformConv2d/RoIAlign/DeformRoIPool/DeformPSRoIPool and standard DeformConv/RoiAlign."
        )

    def add_to_script_impl(self, script):
        script.add_import(imports=["PolygraphyReferenceRunner"], frm="dcnkit.runtime.reference_runner")
        onnx_name = self.arg_groups[OnnxLoadArgs].add_to_script(script)
        script.add_runner(make_invocable("PolygraphyReferenceRunner", onnx_name))


def arg_groups():
    """Entry point of the ``polygraphy.run.plugins`` group: the argument groups this extension adds."""
    return [DcnkitArgs(), DcnkitReferenceRunnerArgs()]


__all__ = ["arg_groups", "DcnkitArgs", "DcnkitReferenceRunnerArgs", "SessionFromOnnxWithDcnkit"]
