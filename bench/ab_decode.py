#!/usr/bin/env python3
"""A/B decode speed of colibri-bench binaries on a host whose bandwidth moves.

On a shared machine memory bandwidth jumps between phases within seconds, so
two binaries run one after the other are often measured in different phases.
This runs the binaries alternately (colibri-bench, 5 requests per run by
default) and tags every timed request with the read test colibri-bench runs
just before it (memory_bandwidth_adjacent), then compares the decode rates of
requests that saw the same phase.

  bench/ab_decode.py --bench old=/tmp/colibri-bench-old --bench new=build/tools/colibri-bench \\
      --model /tmp/colibri-synth/olmoe-1b-7b-int8.colibri --rounds 6

A variant may be the same binary under other environment variables (--env
NAME:VAR=VALUE, repeatable), e.g. the lone-vector prefetch choices:

  bench/ab_decode.py --bench near=build/tools/colibri-bench --bench none=build/tools/colibri-bench \\
      --env near:COLIBRI_STREAM_PREFETCH=near --env none:COLIBRI_STREAM_PREFETCH=none \\
      --model /tmp/colibri-synth/olmoe-1b-7b-int8.colibri --rounds 6

Prints each run's requests as bandwidth:rate, then per variant the median
decode rate of the requests whose adjacent read test was at least --fast-gbps
and of those below --slow-gbps. A request during which the phase changed still
lands in one bin by the test before it: look at the spread, not one number.
Last, per variant, the median over all its requests of each one's roofline
fraction against its own read test (roofline_fraction_per_request), which
needs no bins.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", action="append", required=True, metavar="NAME=PATH",
                        help="a colibri-bench binary to compare (give two or more)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--fast-gbps", type=float, default=50.0)
    parser.add_argument("--slow-gbps", type=float, default=45.0)
    parser.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                        help="run variant NAME with this environment variable set (repeatable)")
    parser.add_argument("--jsonl", help="also append every request as a JSON line to this file")
    parser.add_argument("extra", nargs="*", help="more colibri-bench flags, after --")
    args = parser.parse_args()
    variants = [b.split("=", 1) for b in args.bench]
    if any(len(v) != 2 for v in variants) or len(variants) < 2:
        parser.error("give at least two --bench NAME=PATH")
    names = [name for name, _ in variants]
    if len(set(names)) != len(names):
        parser.error("each --bench needs its own NAME")
    environments = {name: dict(os.environ) for name in names}
    for setting in args.env:
        name, sep, assignment = setting.partition(":")
        var, eq, value = assignment.partition("=")
        if not sep or not eq or not var or name not in environments:
            parser.error(f"--env {setting}: expected NAME:VAR=VALUE with NAME one of {', '.join(names)}")
        environments[name][var] = value
    records = []
    log = open(args.jsonl, "a") if args.jsonl else None
    for _ in range(args.rounds):
        for name, path in variants:
            command = [path, "--model", args.model, "--threads", "2", "--prompt-tokens", "128", "--gen-tokens", "64",
                       "--requests", str(args.requests), "--warmup", "1", "--weights", "copy", "--json"] + args.extra
            run = subprocess.run(command, capture_output=True, text=True, env=environments[name])
            if run.returncode != 0:
                sys.exit(f"{name}: colibri-bench failed: {run.stderr[-2000:]}")
            doc = json.loads(run.stdout)
            adjacent = doc["memory_bandwidth_adjacent"]["best_GBps_per_request"]
            if not adjacent:
                sys.exit(f"{name}: no adjacent read tests ({doc['memory_bandwidth_adjacent']['note']})")
            row = []
            rooflines = doc["memory_bandwidth_adjacent"]["roofline_fraction_per_request"]
            for bandwidth, roofline, request in zip(adjacent, rooflines, doc["per_request"]):
                record = {"variant": name, "adjacent_GBps": bandwidth, "roofline_adjacent": roofline,
                          "decode_tokens_per_s": request["decode_tokens_per_s"]}
                records.append(record)
                if log:
                    log.write(json.dumps(record) + "\n")
                row.append(f"{bandwidth:.0f}:{request['decode_tokens_per_s']:.1f}")
            print(f"{name:>10} {' '.join(row)}", flush=True)
    print()
    for name, _ in variants:
        mine = [r for r in records if r["variant"] == name]
        for label, keep in ((f">= {args.fast_gbps:g} GB/s", lambda b: b >= args.fast_gbps),
                            (f"< {args.slow_gbps:g} GB/s", lambda b: b < args.slow_gbps)):
            rates = sorted(r["decode_tokens_per_s"] for r in mine if keep(r["adjacent_GBps"]))
            if rates:
                print(f"{name:>10} {label:>12}: median {statistics.median(rates):.1f} tok/s over {len(rates)} requests"
                      f" ({rates[0]:.1f}-{rates[-1]:.1f})")
            else:
                print(f"{name:>10} {label:>12}: no requests")
    for name, _ in variants:
        rooflines = sorted(r["roofline_adjacent"] for r in records if r["variant"] == name)
        print(f"{name:>10} roofline against the read test beside each request: median {statistics.median(rooflines):.3f}"
              f" over {len(rooflines)} requests ({rooflines[0]:.3f}-{rooflines[-1]:.3f})")


if __name__ == "__main__":
    main()
