"""KServe v2 / Open Inference Protocol (REST) request parsing and response building, framework-free.

Requests: a JSON header ``{"id", "parameters", "inputs": [{"name", "shape", "datatype", "parameters", "data"}],
"outputs": [{"name", "parameters"}]}``, optionally followed by raw tensor bytes (binary tensor data extension:
the ``Inference-Header-Content-Length`` header gives the JSON length; each binary input carries
``parameters.binary_data_size`` and its bytes follow in input order, little-endian, row-major).
Responses: JSON outputs ``{"name", "shape", "datatype", "data"}``; an output is sent as binary when its request
entry has ``parameters.binary_data: true``, or when the request has ``parameters.binary_data_output: true`` and
does not say otherwise for that output. Every problem raises :class:`ProtocolError` with the HTTP status and a
message that names the field, the expected and the actual value.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from dcnkit.runtime.triton_config import V2_UNSUPPORTED, numpy_dtype, v2_datatype

HEADER_LENGTH = "Inference-Header-Content-Length"


class ProtocolError(Exception):
    """A request the server refuses: ``status`` (HTTP) and ``message`` (sent as ``{"error": message}``)."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass
class InferRequest:
    feeds: dict  # name -> np.ndarray, in model input order
    outputs: list  # [(name, binary: bool)] in response order
    id: str | None = None
    parameters: dict = field(default_factory=dict)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_shape(where: str, shape) -> tuple:
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise ProtocolError(f"{where}.shape: expected a list of non-negative integers, got {shape!r}")
    return tuple(shape)


def _json_array(where: str, data, dtype: np.dtype, shape: tuple) -> np.ndarray:
    n = math.prod(shape)
    if not isinstance(data, list):
        data = [data]
    try:
        if dtype == np.bool_:
            flat = np.asarray(data, dtype=object).reshape(-1)
            if not all(isinstance(v, bool) for v in flat):
                raise ValueError("BOOL data must be true/false")
            arr = flat.astype(np.bool_)
        else:
            arr = np.asarray(data)
            if arr.dtype == object or arr.dtype.kind not in "biuf":
                raise ValueError("not a (nested) list of numbers")
            if dtype.kind in "iu" and arr.dtype.kind == "f":
                raise ValueError("floating point values for an integer datatype")
            if dtype.kind in "iu" and arr.size:
                info = np.iinfo(dtype)
                if arr.min() < info.min or arr.max() > info.max:
                    raise ValueError(f"values outside [{info.min}, {info.max}]")
            arr = arr.astype(dtype).reshape(-1)
    except (ValueError, TypeError, OverflowError) as e:
        raise ProtocolError(f"{where}.data: expected {n} values of datatype {v2_datatype(dtype)}, got invalid data "
                            f"({e})") from None
    if arr.size != n:
        raise ProtocolError(f"{where}.data: expected {n} values for shape {list(shape)}, got {arr.size}")
    return arr.reshape(shape)


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    inputs: Sequence,
    outputs: Sequence,
) -> InferRequest:
    """Parses and validates an inference request against the model's inputs/outputs (``TensorInfo`` s)."""
    if header_length is not None:
        try:
            json_len = int(header_length)
        except ValueError:
            raise ProtocolError(f"{HEADER_LENGTH}: expected an integer, got {header_length!r}") from None
        if json_len < 0 or json_len > len(body):
            raise ProtocolError(f"{HEADER_LENGTH}: expected a value in [0, {len(body)}] (the body size), "
                                f"got {json_len}")
    else:
        json_len = len(body)
    try:
        req = json.loads(body[:json_len])
    except (UnicodeDecodeError, ValueError) as e:
        hint = "" if header_length is not None else f" (binary tensor data needs the {HEADER_LENGTH} header)"
        raise ProtocolError(f"request body: expected JSON, got invalid JSON: {e}{hint}") from None
    if not isinstance(req, dict):
        raise ProtocolError(f"request body: expected a JSON object, got {type(req).__name__}")
    binary = memoryview(body)[json_len:]

    rid = req.get("id")
    if rid is not None and not isinstance(rid, str):
        raise ProtocolError(f"id: expected a string, got {rid!r}")
    params = req.get("parameters", {})
    if not isinstance(params, dict):
        raise ProtocolError(f"parameters: expected an object, got {params!r}")
    for p in ("sequence_id", "sequence_start", "sequence_end"):
        if params.get(p):
            raise ProtocolError(f"parameters.{p}: sequence batching is not supported by this model, got {params[p]!r}")
    all_binary = params.get("binary_data_output", False)
    if not isinstance(all_binary, bool):
        raise ProtocolError(f"parameters.binary_data_output: expected true or false, got {all_binary!r}")

    req_inputs = req.get("inputs")
    if not isinstance(req_inputs, list) or not req_inputs:
        raise ProtocolError(f"inputs: expected a non-empty list of input tensors, got {req_inputs!r}")
    model_inputs = {t.name: t for t in inputs}
    got: dict[str, np.ndarray] = {}
    offset = 0
    for i, t in enumerate(req_inputs):
        where = f"inputs[{i}]"
        if not isinstance(t, dict):
            raise ProtocolError(f"{where}: expected an object, got {t!r}")
        for key in ("name", "shape", "datatype"):
            if key not in t:
                raise ProtocolError(f"{where}: missing required field '{key}'")
        name = t["name"]
        if not isinstance(name, str):
            raise ProtocolError(f"{where}.name: expected a string, got {name!r}")
        where = f"input '{name}'"
        if name not in model_inputs:
            raise ProtocolError(f"{where}: unknown input; expected one of {list(model_inputs)}")
        if name in got:
            raise ProtocolError(f"{where}: given twice")
        info = model_inputs[name]
        shape = _check_shape(where, t["shape"])
        datatype = t["datatype"]
        if datatype in V2_UNSUPPORTED:
            raise ProtocolError(f"{where}.datatype: expected {v2_datatype(info.dtype)}, got {datatype} "
                                "(not supported by this server)")
        try:
            dtype = numpy_dtype(datatype)
        except ValueError as e:
            raise ProtocolError(f"{where}.{e}") from None
        if dtype != info.dtype:
            raise ProtocolError(f"{where}.datatype: expected {v2_datatype(info.dtype)}, got {datatype}")
        if len(shape) != len(info.shape):
            raise ProtocolError(f"{where}.shape: expected rank {len(info.shape)} "
                                f"{[d if isinstance(d, int) else -1 for d in info.shape]}, got {list(shape)}")
        for d, (want, have) in enumerate(zip(info.shape, shape)):
            if isinstance(want, int) and want != have:
                raise ProtocolError(f"{where}.shape[{d}]: expected {want}, got {have} (shape {list(shape)})")
        tparams = t.get("parameters", {}) or {}
        if not isinstance(tparams, dict):
            raise ProtocolError(f"{where}.parameters: expected an object, got {tparams!r}")
        if "shared_memory_region" in tparams:
            raise ProtocolError(f"{where}.parameters.shared_memory_region: shared memory is not supported")
        size = tparams.get("binary_data_size")
        if size is not None:
            if not _is_int(size) or size < 0:
                raise ProtocolError(f"{where}.parameters.binary_data_size: expected an integer >= 0, got {size!r}")
            if "data" in t:
                raise ProtocolError(f"{where}: expected either 'data' or parameters.binary_data_size, got both")
            want = math.prod(shape) * dtype.itemsize
            if size != want:
                raise ProtocolError(f"{where}.parameters.binary_data_size: expected {want} bytes for shape "
                                    f"{list(shape)} {datatype}, got {size}")
            if offset + size > len(binary):
                raise ProtocolError(f"{where}: expected {size} bytes of binary data, got {len(binary) - offset} "
                                    "left in the request body")
            arr = np.frombuffer(binary[offset:offset + size], dtype=dtype.newbyteorder("<")).reshape(shape)
            offset += size
            got[name] = arr.astype(dtype, copy=False)
        else:
            if "data" not in t:
                raise ProtocolError(f"{where}: missing 'data' (or parameters.binary_data_size for binary data)")
            got[name] = _json_array(where, t["data"], dtype, shape)
    if offset != len(binary):
        raise ProtocolError(f"request body: expected {offset} bytes of binary tensor data after the JSON header, "
                            f"got {len(binary)}")
    missing = [n for n in model_inputs if n not in got]
    if missing:
        raise ProtocolError(f"inputs: missing {missing}; the model needs {list(model_inputs)}")

    model_outputs = [t.name for t in outputs]
    req_outputs = req.get("outputs")
    selected = []
    if req_outputs is None:
        selected = [(n, all_binary) for n in model_outputs]
    else:
        if not isinstance(req_outputs, list):
            raise ProtocolError(f"outputs: expected a list, got {req_outputs!r}")
        seen = set()
        for i, o in enumerate(req_outputs):
            if not isinstance(o, dict) or not isinstance(o.get("name"), str):
                raise ProtocolError(f"outputs[{i}]: expected an object with a string 'name', got {o!r}")
            name = o["name"]
            if name not in model_outputs:
                raise ProtocolError(f"output '{name}': unknown output; expected one of {model_outputs}")
            if name in seen:
                raise ProtocolError(f"output '{name}': requested twice")
            seen.add(name)
            op = o.get("parameters", {}) or {}
            if not isinstance(op, dict):
                raise ProtocolError(f"output '{name}'.parameters: expected an object, got {op!r}")
            if op.get("classification"):
                raise ProtocolError(f"output '{name}'.parameters.classification: not supported")
            if "shared_memory_region" in op:
                raise ProtocolError(f"output '{name}'.parameters.shared_memory_region: shared memory is not supported")
            b = op.get("binary_data", all_binary)
            if not isinstance(b, bool):
                raise ProtocolError(f"output '{name}'.parameters.binary_data: expected true or false, got {b!r}")
            selected.append((name, b))
    feeds = {t.name: got[t.name] for t in inputs}
    return InferRequest(feeds=feeds, outputs=selected, id=rid, parameters=params)


def _json_data(a: np.ndarray) -> list:
    return a.reshape(-1).tolist()  # float32 -> the exact double of each value; round-trips through JSON


def build_infer_response(
    model_name: str, model_version: str, request: InferRequest, results: dict
) -> tuple[bytes, int | None]:
    """Response body and the JSON header length (None when the body is JSON only)."""
    outs = []
    chunks = []
    for name, binary in request.outputs:
        a = np.asarray(results[name])
        entry: dict[str, Any] = {"name": name, "shape": list(a.shape), "datatype": v2_datatype(a.dtype)}
        if binary:
            raw = np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(a)
        outs.append(entry)
    resp: dict[str, Any] = {"model_name": model_name, "model_version": model_version, "outputs": outs}
    if request.id is not None:
        resp["id"] = request.id
    header = json.dumps(resp, separators=(",", ":")).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)
