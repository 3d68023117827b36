"""A server in a subprocess, for the tests: a free loopback port, and a command started, waited for until
``/v2/health/ready`` answers 200, then stopped with SIGTERM (it must drain and exit 0)."""
from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
import urllib.request
from typing import Iterator


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(cmd: list[str], port: int, *, env: dict, cwd, timeout: float = 120.0) -> Iterator[subprocess.Popen]:
    """Runs ``cmd`` (a server listening on 127.0.0.1:``port``); yields the process once it is ready. After the
    block it is stopped with SIGTERM and must exit 0; what it printed is then ``proc.log``."""
    proc = subprocess.Popen([str(c) for c in cmd], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while True:
            assert proc.poll() is None, proc.communicate()[0]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"the server did not come up in {timeout:.0f} s"
            time.sleep(0.2)
        yield proc
        proc.send_signal(signal.SIGTERM)
        proc.log, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, proc.log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
