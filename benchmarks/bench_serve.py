"""Serving: ``dcnkit serve`` (the kit's own server, ``--engine light``) vs ``dcnkit serve --engine triton`` (NVIDIA's
tritonserver with Triton's dynamic batching), the demo model (a DCNv2 digits classifier, one 1x8x8 image per
request), over HTTP with tritonclient.

    python benchmarks/bench_serve.py [--concurrency 1 8 32] [--requests 400] [--repeat 5] [--threads 2]

Both servers run at once as ``dcnkit serve`` subprocesses on 127.0.0.1, with the same batching settings
(``--max-batch-size 8 --max-queue-delay-ms 2``). For each concurrency C, C client threads (one tritonclient.http
client each) send ``--requests`` requests in all; throughput is requests per second of wall time, latencies are
per request, client side. The engines run interleaved, round after round; each reports its round of highest
throughput (with that round's p50 / p99), and ``triton/light`` is the ratio of throughputs in the same run.
Every answer is checked against the kit's ONNX Runtime runner in this process. The clients share the machine
with the servers, as they would on one host. ``--threads`` is both servers' ``OMP_NUM_THREADS``; ONNX Runtime keeps
its default intra-op threads in both.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402

NAME = "digits"
ENGINES = ("light", "triton")


def export_demo(path: Path) -> Path:
    import torch

    import dcnkit.export as dk_export
    from dcnkit.demo import build_model

    torch.manual_seed(0)
    dk_export.to_onnx(build_model().eval(), (torch.rand(2, 1, 8, 8),), str(path), dynamic_batch=True, verbose=False)
    return path


def tiny_model(path: Path) -> Path:
    """--quick: a stand-in with the demo model's interface (Flatten + Gemm), built without torch."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = np.random.default_rng(0).standard_normal((64, 10)).astype(np.float32)
    g = helper.make_graph(
        [helper.make_node("Flatten", ["input"], ["flat"]), helper.make_node("Gemm", ["flat", "w"], ["output"])],
        "tiny", [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 1, 8, 8])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["batch", 10])], [numpy_helper.from_array(w, "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    m.ir_version = 9
    onnx.save(m, str(path))
    return path


def start(engine: str, model: Path, workdir: Path, threads: int):
    from dcnkit.runtime.triton_server import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "dcnkit", "serve", str(model), "--engine", engine, "--name", NAME,
           "--port", str(port), "--max-batch-size", "8", "--max-queue-delay-ms", "2", "--log-level", "warning"]
    if engine == "triton":
        cmd += ["--grpc-port", str(free_port()), "--metrics-port", str(free_port())]
    log = open(workdir / f"{engine}.log", "wb")
    env = dict(os.environ, TMPDIR=str(workdir), OMP_NUM_THREADS=str(threads))
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{engine}: dcnkit serve exited: {(workdir / f'{engine}.log').read_text()[-2000:]}")
        try:
            if urllib.request.urlopen(f"http://{url}/v2/models/{NAME}/ready", timeout=2).status == 200:
                return proc, url, log
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{engine}: not ready within 300 s")
        time.sleep(0.3)


def one_round(url: str, concurrency: int, images: np.ndarray, want: np.ndarray) -> dict:
    import tritonclient.http as httpclient

    per = [list(range(k, len(images), concurrency)) for k in range(concurrency)]

    def client(indices):
        lat, bad = [], 0
        with httpclient.InferenceServerClient(url) as c:
            for j in indices:
                i = httpclient.InferInput("input", [1, 1, 8, 8], "FP32")
                i.set_data_from_numpy(images[j:j + 1], binary_data=True)
                t0 = time.perf_counter()
                out = c.infer(NAME, [i]).as_numpy("output")
                lat.append(time.perf_counter() - t0)
                bad += not np.allclose(out, want[j:j + 1], rtol=1e-4, atol=1e-5)
        return lat, bad

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(client, per))
    wall = time.perf_counter() - t0
    lat = np.concatenate([r[0] for r in results]) * 1e3
    bad = sum(r[1] for r in results)
    if bad:
        raise AssertionError(f"{bad} answers differ from the ORT runner")
    return {"rps": len(images) / wall, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--requests", type=int, default=400, help="requests per engine, concurrency and round")
    ap.add_argument("--model", default=None, help="an ONNX model with one input 'input' (N,1,8,8) (default: the demo "
                    "model, exported here)")
    C.add_common_args(ap, repeat=5)
    args = ap.parse_args(argv)
    if args.quick:
        args.concurrency, args.requests, args.repeat, args.warmup = [1, 4], 16, 1, 0  # and tiny_model
    from dcnkit.runtime.registry import make_runner

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        tmp = Path(tmp)
        model = Path(args.model) if args.model else (tiny_model if args.quick else export_demo)(tmp / f"{NAME}.onnx")
        images = np.random.default_rng(0).random((args.requests, 1, 8, 8), dtype=np.float32)
        with make_runner(model, "ort-cpu") as runner:
            want = runner.run({"input": images})["output"]
        servers = {}
        try:
            for engine in ENGINES:
                servers[engine] = start(engine, model, tmp, args.threads)
            best: dict = {}
            for r in range(args.warmup + args.repeat):
                for conc in args.concurrency:
                    for engine in ENGINES:
                        res = one_round(servers[engine][1], conc, images, want)
                        if r >= args.warmup and res["rps"] > best.get((engine, conc), {"rps": -1})["rps"]:
                            best[(engine, conc)] = res
        finally:
            for proc, _, log in servers.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _, log in servers.values():
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                log.close()
    rows, out = [], []
    for conc in args.concurrency:
        light, tri = best[("light", conc)], best[("triton", conc)]
        rows.append([conc, f"{light['rps']:.0f}", f"{light['p50_ms']:.2f}", f"{light['p99_ms']:.2f}",
                     f"{tri['rps']:.0f}", f"{tri['p50_ms']:.2f}", f"{tri['p99_ms']:.2f}",
                     f"{tri['rps'] / light['rps']:.2f}"])
        out.append({"concurrency": conc, "light": light, "triton": tri, "triton_over_light": tri["rps"] / light["rps"]})
    what = args.model or ("a tiny stand-in (--quick)" if args.quick else "demo model")
    print(f"{what}, {args.requests} requests of one image per round, best of {args.repeat} rounds")
    C.print_table(["clients", "light req/s", "light p50 ms", "light p99 ms", "triton req/s", "triton p50 ms",
                   "triton p99 ms", "triton/light"], rows)
    C.write_json(args, {"requests": args.requests, "rounds": args.repeat, "rows": out})
    return 0


if __name__ == "__main__":
    sys.exit(main())
