#!/usr/bin/env python3
"""Times a ctypes round trip through libcolibri's batch router: 1024 tokens of
gate logits over 64 experts, top-8, from Python (numpy in, numpy out).

    COLIBRI_LIBRARY=build/lib/libcolibri.so /usr/bin/python3 bindings/python/bench_route.py

Reports the median over many runs of
  * Router.route(logits, out=...)   the binding's call (checks + ctypes call),
  * Router.route(logits)            the same, allocating the outputs,
  * the bare ctypes call            colibri_route_batch_experts alone,
  * Router.route on an empty batch  the fixed cost of one round trip,
and the per-token cost of the first. Not part of the test suite.
"""

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

import colibri  # noqa: E402
from colibri import _ffi  # noqa: E402


def median_seconds(fn, runs: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--experts", type=int, default=64)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--normalize", action="store_true")
    args = parser.parse_args()
    if args.tokens < 1 or args.runs < 1:
        parser.error("--tokens and --runs must be >= 1")

    router = colibri.Router(args.experts, args.top_k, normalize=args.normalize)
    logits = np.random.default_rng(0).normal(size=(args.tokens, args.experts)).astype(np.float32)
    experts = np.empty((args.tokens, args.top_k), np.int32)
    weights = np.empty((args.tokens, args.top_k), np.float32)
    out = (experts, weights)

    raw = _ffi.lib().colibri_route_batch_experts
    handle = router._handle
    addresses = (logits.ctypes.data, experts.ctypes.data, weights.ctypes.data)

    def bare():
        if raw(handle, addresses[0], args.tokens, addresses[1], addresses[2]) != 0:
            raise RuntimeError(_ffi.lib().colibri_last_error())

    binding = median_seconds(lambda: router.route(logits, out=out), args.runs, args.warmup)
    allocating = median_seconds(lambda: router.route(logits), args.runs, args.warmup)
    bare_call = median_seconds(bare, args.runs, args.warmup)
    empty = np.empty((0, args.experts), np.float32)
    empty_out = (np.empty((0, args.top_k), np.int32), np.empty((0, args.top_k), np.float32))
    round_trip = median_seconds(lambda: router.route(empty, out=empty_out), args.runs, args.warmup)

    print(f"libcolibri: {colibri.library_path()}")
    print(f"routing {args.tokens} tokens x {args.experts} experts, top-{args.top_k}"
          f"{', renormalised' if args.normalize else ''}; median of {args.runs} runs")
    print(f"  Router.route(logits, out=...): {binding * 1e6:9.1f} us  ({binding * 1e9 / args.tokens:6.1f} ns/token)")
    print(f"  Router.route(logits):          {allocating * 1e6:9.1f} us")
    print(f"  bare ctypes call:              {bare_call * 1e6:9.1f} us")
    print(f"  Router.route(0 tokens):        {round_trip * 1e6:9.1f} us  (the fixed cost of a round trip)")


if __name__ == "__main__":
    main()
