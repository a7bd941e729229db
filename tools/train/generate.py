#!/usr/bin/python3
"""Generate text from a Hugging Face Mixtral directory (e.g. models/default) with the
reference PyTorch implementation in mixtral.py, reading the saved BF16 safetensors and
tokenizer.json (not the training-time objects), so it also checks the exported files.

    /usr/bin/python3 tools/train/generate.py --model models/default \
        --prompt "And God said" --prompt "The president of the" --max-tokens 40

Greedy decoding (ties -> lowest id) and seeded sampling (temperature / top-k). No BOS is
added (the tokenizer has add_bos_token=false); generation stops at <|endoftext|> unless
--no-stop. With --json, prints token ids too (to compare with colibri-run).
"""
import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from mixtral import load_hf_dir  # noqa: E402


@torch.no_grad()
def generate(model, ids, n, temperature=0.0, top_k=0, gen=None, eos=None):
    caches = [{} for _ in model.layers]
    logits, _, _ = model(torch.tensor([ids]), 0, caches)
    pos, out = len(ids), []
    for _ in range(n):
        last = logits[0, -1].float()
        if temperature <= 0:
            nxt = int(torch.argmax(last))  # first max -> lowest id on ties
        else:
            z = last / temperature
            if top_k:
                kth = torch.topk(z, top_k).values[-1]
                z = z.masked_fill(z < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(z, -1), 1, generator=gen))
        out.append(nxt)
        if eos is not None and nxt == eos:
            break
        logits, _, _ = model(torch.tensor([[nxt]]), pos, caches)
        pos += 1
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--prompt", action="append")
    ap.add_argument("--max-tokens", type=int, default=40)
    ap.add_argument("--samples", type=int, default=2, help="sampled continuations per prompt")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-stop", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(2)
    model, cfg = load_hf_dir(a.model)
    tok = bpe.Tokenizer.load(os.path.join(a.model, "tokenizer.json"))
    eos = None if a.no_stop else cfg["eos_token_id"]
    prompts = a.prompt or ["And God said", "The president of the"]
    results = []
    for p in prompts:
        ids = tok.encode(p)
        g = generate(model, ids, a.max_tokens, eos=eos)
        r = {"prompt": p, "prompt_ids": ids, "greedy_ids": g, "greedy": tok.decode(g), "samples": []}
        gen = torch.Generator().manual_seed(a.seed)
        for _ in range(a.samples):
            s = generate(model, ids, a.max_tokens, a.temperature, a.top_k, gen, eos)
            r["samples"].append(tok.decode(s))
        results.append(r)
        if not a.json:
            print(f"=== {p!r}\n[greedy] {p}{r['greedy']}")
            for s in r["samples"]:
                print(f"[T={a.temperature}, top-k={a.top_k}] {p}{s}")
    if a.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
