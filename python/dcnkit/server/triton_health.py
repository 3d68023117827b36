"""The health inference of ``dcnkit serve --engine triton``: a stub that is alive but hangs (a deadlock in native code,
a model run that never returns) keeps its process and Triton's readiness, and every request waits on it. The
supervisor finds it by what it does: when no inference has completed for ``interval_s`` (Triton's statistics
extension, ``/v2/models/<m>/stats``), it sends one inference of zeros of the model's input shapes (``/v2/models/<m>``
metadata, dynamic dims as 1, Triton's binary tensor extension) and waits at most ``timeout_s``. Any answer, an error
included, is a live stub. No answer, while no other request completed either, is a hang. A model that is busy
(inferences completing) is never probed; an idle one at most once per ``interval_s``.
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request

# Bytes per element of Triton's datatypes (BYTES: a 4-byte length prefix, 0 for an empty string).
_ITEM_BYTES = {"BOOL": 1, "UINT8": 1, "INT8": 1, "UINT16": 2, "INT16": 2, "FP16": 2, "BF16": 2, "UINT32": 4,
               "INT32": 4, "FP32": 4, "UINT64": 8, "INT64": 8, "FP64": 8, "BYTES": 4}


def _get_json(url: str, timeout: float):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def completed_inferences(http_url: str, model: str, timeout: float = 1.0) -> int | None:
    """Inferences of ``model`` that completed (succeeded or failed) so far, from Triton's statistics; None when
    the server does not answer."""
    stats = _get_json(f"http://{http_url}/v2/models/{model}/stats", timeout)
    try:
        return sum(int(s["inference_stats"][k]["count"]) for s in stats["model_stats"] for k in ("success", "fail"))
    except (KeyError, TypeError, ValueError):
        return None


def probe_request(http_url: str, model: str, timeout: float = 2.0) -> tuple[bytes, dict] | None:
    """The body and headers of one inference of zeros for ``model`` (binary tensor extension); None when an input
    has a datatype outside Triton's list."""
    meta = _get_json(f"http://{http_url}/v2/models/{model}", timeout)
    if not isinstance(meta, dict) or not isinstance(meta.get("inputs"), list):
        # No metadata: a request without inputs, which a server that hands every request to its stub still sends on
        # (Triton itself refuses it without asking the stub: the metadata is always there).
        return b'{"inputs": []}', {"Content-Type": "application/json"}
    inputs, blobs = [], []
    for spec in meta["inputs"]:
        size = _ITEM_BYTES.get(spec.get("datatype"))
        if size is None:
            return None
        shape = [int(d) if int(d) > 0 else 1 for d in spec.get("shape", [])]
        n = size
        for d in shape:
            n *= d
        inputs.append({"name": spec["name"], "shape": shape, "datatype": spec["datatype"],
                       "parameters": {"binary_data_size": n}})
        blobs.append(bytes(n))
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


class HealthProbe:
    """Decides, poll by poll, whether ``model`` hangs (the module docstring); ``timeout_s`` 0 turns it off."""

    def __init__(self, model: str, timeout_s: float, interval_s: float | None = None):
        if not timeout_s >= 0:
            raise ValueError(f"health_timeout_s: expected a number >= 0 (0: off), got {timeout_s!r}")
        self.model, self.timeout_s = model, float(timeout_s)
        self.interval_s = 2 * self.timeout_s if interval_s is None else float(interval_s)
        self.reset("", 0.0)

    def reset(self, http_url: str, now: float) -> None:
        """A (re)loaded model: no probe in flight, the next one after ``interval_s``."""
        self.http_url = http_url
        self._answered: threading.Event | None = None
        self._unhealthy: str | None = None
        self._sent_at = self._idle_since = now
        self._count: int | None = None

    def check(self, now: float) -> str | None:
        """The cause when the model hangs or its stub is dead, else None (sends a probe in the background when it
        is time)."""
        if self.timeout_s <= 0 or not self.http_url:
            return None
        if self._answered is not None:
            if self._answered.is_set():
                self._answered, self._idle_since = None, now
                if self._unhealthy:  # Triton's answer for a stub that is gone, whatever /proc shows
                    return f"the health inference was answered: {self._unhealthy}"
                return None
            if now - self._sent_at < self.timeout_s:
                return None
            count = completed_inferences(self.http_url, self.model)
            if count is not None and self._count is not None and count != self._count:  # others complete: busy
                self._count, self._sent_at = count, now
                return None
            return (f"no answer to a health inference within {self.timeout_s:g} s and no inference completed "
                    "(the backend stub hangs)")
        if now - self._idle_since < self.interval_s:
            return None
        count = completed_inferences(self.http_url, self.model)
        progressed = count is not None and self._count is not None and count != self._count
        self._count = count if count is not None else self._count
        if progressed:  # inferences completed since the last look: alive
            self._idle_since = now
            return None
        request = probe_request(self.http_url, self.model)
        if request is None:  # no metadata now (loading, or a server that cannot tell): look again later
            self._idle_since = now
            return None
        self._send(request, now)
        return None

    def _send(self, request: tuple[bytes, dict], now: float) -> None:
        body, headers = request
        answered = threading.Event()
        req = urllib.request.Request(f"http://{self.http_url}/v2/models/{self.model}/infer", data=body,
                                     headers=headers, method="POST")

        def send():
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s + 30) as r:
                    r.read()
            except urllib.error.HTTPError as e:  # an answer (the zeros may not suit the model): a live stub, unless
                text = e.read().decode(errors="replace")  # Triton says the stub is not healthy
                if "is not healthy" in text:
                    self._unhealthy = f"{e.code} {text.strip()}"
            except OSError:  # no answer (timed out, connection closed): left unset
                return
            answered.set()

        self._answered, self._sent_at, self._unhealthy = answered, now, None
        threading.Thread(target=send, daemon=True, name="triton-health-inference").start()


__all__ = ["HealthProbe", "completed_inferences", "probe_request"]
