"""Query a model served by NVIDIA Triton or by `dcnkit serve` with NVIDIA's tritonclient (pip install tritonclient[http]).

    python runtime/triton/client_example.py --url localhost:8000 --model dcn [--batch 2] [--requests 16]

Reads the model's metadata, fills every input with random data of the right shape (dynamic dims -> --batch /
--dim), sends --requests concurrent requests (so the server's dynamic batcher can combine them) and prints the
output shapes and the server's statistics. RoI inputs (names containing "roi") get valid boxes with batch
index 0 so that the kit's RoI ops accept them.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import triton_to_np_dtype


def random_inputs(metadata: dict, batch: int, dim: int, rng: np.random.Generator) -> list:
    inputs = []
    for t in metadata["inputs"]:
        shape = [d if d >= 0 else (batch if i == 0 else dim) for i, d in enumerate(t["shape"])]
        dtype = triton_to_np_dtype(t["datatype"])
        if "roi" in t["name"].lower() and len(shape) == 2 and shape[1] == 5:
            xy = np.sort(rng.uniform(0, dim, size=(shape[0], 2, 2)), axis=1)  # x1 <= x2, y1 <= y2
            a = np.concatenate([np.zeros((shape[0], 1)), xy[:, 0], xy[:, 1]], axis=1).astype(dtype)
        else:
            a = rng.standard_normal(shape).astype(dtype)
        inp = httpclient.InferInput(t["name"], shape, t["datatype"])
        inp.set_data_from_numpy(a, binary_data=True)
        inputs.append(inp)
    return inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="localhost:8000", help="host:port of the HTTP endpoint")
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", type=int, default=1, help="value for a dynamic first dim")
    ap.add_argument("--dim", type=int, default=32, help="value for other dynamic dims")
    ap.add_argument("--requests", type=int, default=16, help="concurrent requests to send (bounded)")
    args = ap.parse_args()
    if not 1 <= args.requests <= 10000:
        ap.error(f"--requests: expected 1..10000, got {args.requests}")

    client = httpclient.InferenceServerClient(url=args.url)
    if not client.is_server_ready() or not client.is_model_ready(args.model):
        print(f"{args.url}: server or model '{args.model}' not ready")
        return 1
    md = client.get_model_metadata(args.model)
    print(f"model {md['name']} versions {md.get('versions')} platform {md.get('platform')}")
    for kind in ("inputs", "outputs"):
        for t in md[kind]:
            print(f"  {kind[:-1]:6s} {t['name']}: {t['datatype']} {t['shape']}")

    def one(i):
        c = httpclient.InferenceServerClient(url=args.url)
        try:
            res = c.infer(args.model, random_inputs(md, args.batch, args.dim, np.random.default_rng(i)))
            return {o["name"]: res.as_numpy(o["name"]).shape for o in md["outputs"]}
        finally:
            c.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(min(8, args.requests)) as pool:
        shapes = list(pool.map(one, range(args.requests)))
    dt = time.perf_counter() - t0
    print(f"{args.requests} requests in {dt:.3f} s ({args.requests / dt:.1f} req/s); first output shapes {shapes[0]}")
    st = client.get_inference_statistics(args.model)["model_stats"][0]
    print(f"server: inference_count {st['inference_count']}, execution_count {st['execution_count']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
