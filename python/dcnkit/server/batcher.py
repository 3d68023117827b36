"""Dynamic batching: requests wait in a bounded queue; one worker thread concatenates compatible requests
along dim 0 (up to ``max_batch_size`` rows, or what has arrived when ``max_queue_delay_ms`` has passed since the
oldest one came), runs the model once and splits the outputs back.

Requests are compatible when every input has the same dtype and the same dims after the first. Batching is
only done for models whose inputs and outputs all share their first (symbolic) dim: see
:func:`dcnkit.runtime.triton.shared_batch_dim`. Other models (RoI models: ``x`` is per image, ``rois`` per box)
run one request at a time. If a batched run fails, or its outputs do not split (first dim != rows sent), each
request of the batch is run alone, so one bad request never fails its neighbours.
"""
from __future__ import annotations

import collections
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from dcnkit.server.protocol import ProtocolError


class QueueFull(ProtocolError):
    def __init__(self, size: int):
        super().__init__(f"queue: full ({size} requests waiting, --max-queue-size {size}); retry later", 503)


class ShuttingDown(ProtocolError):
    def __init__(self):
        super().__init__("server: shutting down, not accepting new requests", 503)


# Exceptions from a runner that mean "bad input" (HTTP 400) rather than a server fault (HTTP 500).
_CLIENT_ERRORS = ("ValueError", "TypeError", "IndexError", "InvalidArgument")


def _as_protocol_error(e: BaseException) -> ProtocolError:
    if isinstance(e, ProtocolError):
        return e
    status = 400 if type(e).__name__ in _CLIENT_ERRORS else 500
    return ProtocolError(f"inference failed: {type(e).__name__}: {e}", status)


@dataclass
class _Item:
    feeds: dict
    rows: int
    key: tuple
    future: Future
    t_enqueue: float = field(default_factory=time.monotonic)


@dataclass
class Stats:
    inference_count: int = 0  # requests answered successfully
    execution_count: int = 0  # model runs
    fail_count: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    last_inference_ms: int = 0
    batch_sizes: dict = field(default_factory=dict)  # requests per run -> [count, compute ns]


class Batcher:
    """Queue + worker thread in front of a runner (``run(feeds) -> dict``)."""

    def __init__(
        self,
        runner,
        *,
        batching: bool,
        max_batch_size: int = 8,
        max_queue_delay_ms: float = 2.0,
        max_queue_size: int = 128,
        on_batch: Callable[[int, int, float], None] | None = None,
    ):
        if max_queue_size < 1:
            raise ValueError(f"max_queue_size: expected >= 1, got {max_queue_size}")
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size: expected >= 1, got {max_batch_size}")
        if max_queue_delay_ms < 0:
            raise ValueError(f"max_queue_delay_ms: expected >= 0, got {max_queue_delay_ms}")
        self.runner = runner
        self.batching = bool(batching) and max_batch_size > 1
        self.max_batch_size = max_batch_size
        self.delay = max_queue_delay_ms / 1000.0
        self.max_queue_size = max_queue_size
        self.on_batch = on_batch
        self.stats = Stats()
        self._queue: collections.deque[_Item] = collections.deque()
        self._cv = threading.Condition()
        self._stopping = False
        self._busy = False
        self._thread = threading.Thread(target=self._loop, name="dcnkit-batcher", daemon=True)
        self._thread.start()

    # -- public ---------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return len(self._queue)

    @property
    def accepting(self) -> bool:
        return not self._stopping

    def submit(self, feeds: dict) -> Future:
        """Queues one request; QueueFull / ShuttingDown (HTTP 503) when it cannot be taken."""
        rows = 1
        if self.batching:
            rows = next(iter(feeds.values())).shape[0]
            for name, a in feeds.items():
                if a.shape[0] != rows:
                    raise ProtocolError(
                        f"input '{name}'.shape[0]: expected the batch size {rows} shared by all inputs, "
                        f"got {a.shape[0]}"
                    )
            if rows > self.max_batch_size:
                raise ProtocolError(
                    f"input '{next(iter(feeds))}'.shape[0]: expected a batch size <= max_batch_size "
                    f"{self.max_batch_size}, got {rows}"
                )
        key = tuple((n, a.dtype.str, a.shape[1:]) for n, a in feeds.items())
        fut: Future = Future()
        with self._cv:
            if self._stopping:
                raise ShuttingDown()
            if len(self._queue) >= self.max_queue_size:
                raise QueueFull(self.max_queue_size)
            self._queue.append(_Item(feeds, rows, key, fut))
            self._cv.notify_all()
        return fut

    def close(self, drain: bool = True, timeout: float | None = None) -> None:
        """Stops taking requests; with ``drain`` answers everything queued first, else fails it (503)."""
        with self._cv:
            self._stopping = True
            if not drain:
                while self._queue:
                    it = self._queue.popleft()
                    if it.future.set_running_or_notify_cancel():
                        it.future.set_exception(ShuttingDown())
            self._cv.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    # -- worker ---------------------------------------------------------------------------------
    def _take(self) -> list[_Item] | None:
        with self._cv:
            while not self._queue and not self._stopping:
                self._cv.wait()
            if not self._queue:
                return None
            first = self._queue[0]
            if not self.batching:
                return [self._queue.popleft()]
            deadline = first.t_enqueue + self.delay
            while not self._stopping:
                rows = sum(it.rows for it in self._queue if it.key == first.key)
                left = deadline - time.monotonic()
                if rows >= self.max_batch_size or left <= 0:
                    break
                self._cv.wait(left)
            batch, rest, rows = [], collections.deque(), 0
            for it in self._queue:
                if it.key == first.key and rows + it.rows <= self.max_batch_size:
                    batch.append(it)
                    rows += it.rows
                else:
                    rest.append(it)
            self._queue = rest
            return batch

    def _loop(self) -> None:
        while True:
            batch = self._take()
            if batch is None:
                return
            batch = [it for it in batch if it.future.set_running_or_notify_cancel()]  # skip cancelled
            if batch:
                self._busy = True
                try:
                    self._execute(batch)
                finally:
                    self._busy = False

    def _run(self, items: list[_Item]) -> dict:
        if len(items) == 1:
            feeds = items[0].feeds
        else:
            feeds = {n: np.concatenate([it.feeds[n] for it in items]) for n in items[0].feeds}
        t0 = time.perf_counter_ns()
        out = self.runner.run(feeds)
        dt = time.perf_counter_ns() - t0
        st = self.stats
        st.execution_count += 1
        st.compute_ns += dt
        bs = st.batch_sizes.setdefault(len(items), [0, 0])
        bs[0] += 1
        bs[1] += dt
        if self.on_batch is not None:
            try:
                self.on_batch(len(items), sum(it.rows for it in items), dt / 1e9)
            except Exception:  # pragma: no cover - metrics must never break serving
                pass
        return out

    def _finish(self, it: _Item, result=None, error: BaseException | None = None) -> None:
        now = time.monotonic()
        if error is None:
            self.stats.inference_count += 1
            self.stats.last_inference_ms = int(time.time() * 1000)
            it.future.set_result(result)
        else:
            self.stats.fail_count += 1
            it.future.set_exception(_as_protocol_error(error))
        self.stats.queue_ns += int((now - it.t_enqueue) * 1e9)

    def _execute(self, batch: list[_Item]) -> None:
        if len(batch) > 1:
            try:
                out = self._run(batch)
                total = sum(it.rows for it in batch)
                if all(np.ndim(v) >= 1 and np.shape(v)[0] == total for v in out.values()):
                    start = 0
                    for it in batch:
                        self._finish(it, {k: v[start:start + it.rows] for k, v in out.items()})
                        start += it.rows
                    return
            except Exception:
                pass  # run them one by one below: only the faulty request fails
        for it in batch:
            try:
                self._finish(it, self._run([it]))
            except Exception as e:  # noqa: BLE001 - reported to the client
                self._finish(it, error=e)
