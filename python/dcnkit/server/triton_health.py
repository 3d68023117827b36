"""The health inference of ``dcnkit serve --engine triton``: a stub that is alive but hangs (a deadlock in native code,
a model run that never returns) keeps its process and Triton's readiness, and every request waits on it. The supervisor
finds it by what it does: when no inference has completed for ``interval_s`` (Triton's statistics extension,
``/v2/models/<m>/stats``), it sends one inference of zeros of the model's input shapes and waits at most ``timeout_s``.
Any answer, an error included, is a live stub, except two: ``503 ... Exceeds maximum queue size`` is Triton refusing the
request without running it (its queue is full, as it soon is behind a hung stub under load), so the probe counts as
unanswered and the statistics decide (none: no word, the next probe later); and ``Stub process ... is not healthy`` is a
dead stub. No answer, while no other request completed either, is a hang. A model that is busy (inferences completing)
is never probed; an idle one at most once per ``interval_s``.

The inputs come from the model's metadata (``/v2/models/<m>``), else its configuration (``/v2/models/<m>/config``,
else the repository's ``config.pbtxt``): each dynamic dim 1, a batch of 1 where the model batches. The zeros go as
JSON, the protocol's own encoding that every server reads (BF16, which JSON cannot carry, as Triton's binary tensor
extension).
"""
from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from pathlib import Path

_ZERO = {"BOOL": False, "BYTES": ""}  # the JSON zero of a datatype (0 for the numbers)


def _get_json(url: str, timeout: float):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def completed_inferences(http_url: str, model: str, timeout: float = 1.0) -> int | None:
    """Inferences of ``model`` that completed (succeeded or failed) so far, from Triton's statistics (or the model
    runs, ``execution_count``, where a server has only those); None when the server does not answer."""
    stats = _get_json(f"http://{http_url}/v2/models/{model}/stats", timeout)
    try:
        models = stats["model_stats"]
        try:
            return sum(int(s["inference_stats"][k]["count"]) for s in models for k in ("success", "fail"))
        except KeyError:
            return sum(int(s["execution_count"]) for s in models)
    except (KeyError, TypeError, ValueError):
        return None


def input_specs(http_url: str, model: str, repository=None, timeout: float = 2.0) -> list[tuple] | None:
    """``[(name, datatype, shape)]`` of the model's required inputs (the module docstring says from where), each
    ``-1`` dim 1; None when nothing says."""
    meta = _get_json(f"http://{http_url}/v2/models/{model}", timeout)
    if isinstance(meta, dict) and isinstance(meta.get("inputs"), list):
        return [(t["name"], t["datatype"], [max(1, int(d)) for d in t.get("shape", [])]) for t in meta["inputs"]]
    cfg = _get_json(f"http://{http_url}/v2/models/{model}/config", timeout)
    if not (isinstance(cfg, dict) and isinstance(cfg.get("input"), list)) and repository is not None:
        try:
            from google.protobuf import json_format

            from dcnkit.runtime.triton import parse_config

            cfg = json_format.MessageToDict(parse_config((Path(repository) / model / "config.pbtxt").read_text()),
                                            preserving_proto_field_name=True)
        except Exception:  # noqa: BLE001 - no file, no schema here, a file it refuses: nothing says
            return None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("input"), list):
        return None
    batch = [1] if int(cfg.get("max_batch_size") or 0) > 0 else []
    specs = []
    for t in cfg["input"]:
        if not t.get("optional"):
            datatype = str(t.get("data_type", "TYPE_FP32")).removeprefix("TYPE_").replace("STRING", "BYTES")
            specs.append((t["name"], datatype, batch + [max(1, int(d)) for d in t.get("dims", [])]))
    return specs


def probe_request(http_url: str, model: str, timeout: float = 2.0, repository=None) -> tuple[bytes, dict]:
    """The body and headers of one inference of zeros for ``model``: JSON (BF16 inputs: Triton's binary tensor
    extension). Where nothing says what the inputs are, a request without inputs (Triton refuses it unrun; a
    server that hands every request to its stub sends it on)."""
    specs = input_specs(http_url, model, repository, timeout)
    if specs is None:
        return b'{"inputs": []}', {"Content-Type": "application/json"}
    inputs, blobs = [], []
    for name, datatype, shape in specs:
        n = 1
        for d in shape:
            n *= d
        if datatype == "BF16":
            inputs.append({"name": name, "shape": shape, "datatype": datatype,
                           "parameters": {"binary_data_size": 2 * n}})
            blobs.append(bytes(2 * n))
        else:
            inputs.append({"name": name, "shape": shape, "datatype": datatype, "data": [_ZERO.get(datatype, 0)] * n})
    header = json.dumps({"inputs": inputs}).encode()
    if not blobs:
        return header, {"Content-Type": "application/json"}
    return header + b"".join(blobs), {"Inference-Header-Content-Length": str(len(header)),
                                      "Content-Type": "application/octet-stream"}


class _Outcome:
    """What one health inference got, written by the thread that sent it."""

    def __init__(self, sent_at: float):
        self.sent_at = sent_at
        self.answered = threading.Event()  # an answer that says the stub runs (success, or the model's error)
        self.unhealthy: str | None = None  # Triton's "Stub process ... is not healthy" answer
        self.refused: str | None = None  # Triton's refusal without running it (503: its queue is full)


class HealthProbe:
    """Decides, poll by poll, whether ``model`` hangs (the module docstring); ``timeout_s`` 0 turns it off."""

    def __init__(self, model: str, timeout_s: float, interval_s: float | None = None, repository=None):
        """``repository``: where the model's ``config.pbtxt`` is, should the server not describe its inputs."""
        if not timeout_s >= 0:
            raise ValueError(f"health_timeout_s: expected a number >= 0 (0: off), got {timeout_s!r}")
        self.model, self.timeout_s, self.repository = model, float(timeout_s), repository
        self.interval_s = 2 * self.timeout_s if interval_s is None else float(interval_s)
        self.reset("", 0.0)

    def reset(self, http_url: str, now: float) -> None:
        """A (re)loaded model: no probe in flight, the next one after ``interval_s``."""
        self.http_url = http_url
        self._probe: _Outcome | None = None
        self._idle_since = now
        self._count: int | None = None

    def check(self, now: float) -> str | None:
        """The cause when the model hangs or its stub is dead, else None (sends a probe in the background when it
        is time)."""
        if self.timeout_s <= 0 or not self.http_url:
            return None
        probe = self._probe
        if probe is not None:
            if probe.answered.is_set():
                self._probe, self._idle_since = None, now
                if probe.unhealthy:  # Triton's answer for a stub that is gone, whatever /proc shows
                    return f"the health inference was answered: {probe.unhealthy}"
                return None
            if now - probe.sent_at < self.timeout_s:
                return None
            count = completed_inferences(self.http_url, self.model)
            known = count is not None and self._count is not None
            if probe.refused and not known:  # refused, and no statistics to decide: no word; the next one later
                self._probe, self._idle_since = None, now
                return None
            if known and count != self._count:  # others complete: busy
                if probe.refused:  # that probe will not be answered: alive; the next one when idle again
                    self._probe, self._idle_since, self._count = None, now, count
                    return None
                self._count, probe.sent_at = count, now
                return None
            refused = f" (Triton refused it: {probe.refused})" if probe.refused else ""
            return (f"no answer to a health inference within {self.timeout_s:g} s{refused} and no inference "
                    "completed (the backend stub hangs)")
        if now - self._idle_since < self.interval_s:
            return None
        count = completed_inferences(self.http_url, self.model)
        progressed = count is not None and self._count is not None and count != self._count
        self._count = count if count is not None else self._count
        if progressed:  # inferences completed since the last look: alive
            self._idle_since = now
            return None
        self._send(probe_request(self.http_url, self.model, repository=self.repository), now)
        return None

    def _send(self, request: tuple[bytes, dict], now: float) -> None:
        body, headers = request
        probe = self._probe = _Outcome(now)
        req = urllib.request.Request(f"http://{self.http_url}/v2/models/{self.model}/infer", data=body,
                                     headers=headers, method="POST")

        def send():
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s + 30) as r:
                    r.read()
            except urllib.error.HTTPError as e:  # an answer (the zeros may not suit the model): a live stub, unless
                text = e.read().decode(errors="replace")  # Triton says the stub is not healthy, or refused it
                if "is not healthy" in text:
                    probe.unhealthy = f"{e.code} {text.strip()}"
                elif e.code == 503:  # refused unrun (a full queue): no word on the stub, the statistics decide
                    probe.refused = f"{e.code} {text.strip()}"
                    return
            except OSError:  # no answer (timed out, connection closed): left unset
                return
            probe.answered.set()

        threading.Thread(target=send, daemon=True, name="triton-health-inference").start()


__all__ = ["HealthProbe", "completed_inferences", "input_specs", "probe_request"]
