"""Defaults of ``create_app`` / ``serve`` / ``dcnkit serve`` (apart, so that the CLI shows them without importing
FastAPI)."""

DEFAULTS = dict(max_batch_size=8, max_queue_delay_ms=2.0, max_queue_size=128, max_request_bytes=64 << 20)
MAX_RESTARTS = 5  # --engine triton: restarts in a row of a dead backend before the model is reported failed
