#!/usr/bin/env python3
"""Compares a colibri-run --logits-out file with a reference.json.

Checks what the engine-core issue requires of a correct f32 engine: identical
prompt token ids, identical argmax at every position, every logit among the
reference's top-64 within a tolerance, and an identical greedy continuation.

usage: compare_logits.py CANDIDATE REFERENCE --prompt-id ID [--tolerance 1e-3]
Exit status 0 when everything matches, 1 otherwise (the first mismatch is printed).
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("candidate")
    parser.add_argument("reference")
    parser.add_argument("--prompt-id", help="reference prompt to compare with (default: the one with the same tokens)")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    args = parser.parse_args()

    with open(args.candidate, encoding="utf-8") as f:
        candidate = json.load(f)["prompts"][0]
    with open(args.reference, encoding="utf-8") as f:
        reference_prompts = json.load(f)["prompts"]
    if args.prompt_id:
        matches = [p for p in reference_prompts if p["prompt_id"] == args.prompt_id]
    else:
        matches = [p for p in reference_prompts if p["tokens"] == candidate["tokens"]]
    if not matches:
        print("no reference prompt matches", file=sys.stderr)
        return 1
    reference = matches[0]

    if candidate["tokens"] != reference["tokens"]:
        print(f"prompt tokens differ:\n  got      {candidate['tokens']}\n  expected {reference['tokens']}")
        return 1
    if len(candidate["positions"]) != len(reference["positions"]):
        print(f"{len(candidate['positions'])} positions, expected {len(reference['positions'])}")
        return 1
    worst = 0.0
    for got, want in zip(candidate["positions"], reference["positions"]):
        if got["argmax"] != want["argmax"]:
            print(f"position {want['pos']}: argmax {got['argmax']}, expected {want['argmax']}")
            return 1
        got_logits = dict((int(i), v) for i, v in got["top"])
        for token, logit in want["top"]:
            if token not in got_logits:
                print(f"position {want['pos']}: token {token} of the reference top-64 is not in ours")
                return 1
            diff = abs(got_logits[token] - logit)
            worst = max(worst, diff)
            if diff > args.tolerance:
                print(f"position {want['pos']}: token {token} logit {got_logits[token]}, expected {logit}")
                return 1
    want_generated = reference["generated"]["tokens"]
    got_generated = candidate["generated"]["tokens"]
    if got_generated != want_generated:
        print(f"greedy continuation differs:\n  got      {got_generated}\n  expected {want_generated}")
        return 1
    print(f"{reference['prompt_id']}: {len(want_generated)} generated tokens identical, "
          f"max |dlogit| over top-64 = {worst:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
