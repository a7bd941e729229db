#!/usr/bin/python3
"""Compare the C++ engine (colibri-run) with the PyTorch reference on a model directory.

    /usr/bin/python3 tools/train/compare_colibri.py --model models/default \
        --colibri build/tools/colibri-run --prompt "And God said" --max-tokens 30

For every prompt: the prompt token ids (Python BPE vs engine), the top-64 logits of every
prompt position (max |difference|), and the greedy continuation (ids must match; if they
diverge, the PyTorch top-2 margin at the divergence point is printed, since a near-tie can
legitimately flip between float32 implementations). Exit status 0 if all ids match.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from mixtral import load_hf_dir  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--colibri", default="build/tools/colibri-run")
    ap.add_argument("--prompt", action="append")
    ap.add_argument("--max-tokens", type=int, default=30)
    a = ap.parse_args()
    torch.set_num_threads(2)
    model, cfg = load_hf_dir(a.model)
    tok = bpe.Tokenizer.load(os.path.join(a.model, "tokenizer.json"))
    ok = True
    for p in a.prompt or ["And God said", "The president of the"]:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            out = f.name
        r = subprocess.run([a.colibri, "--model", a.model, "--prompt", p, "--max-tokens", str(a.max_tokens),
                            "--logits-out", out], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"colibri-run failed ({r.returncode}): {r.stderr.strip()}")
            return 2
        with open(out) as f:
            j = json.load(f)
        os.unlink(out)
        rec = j["prompts"][0] if "prompts" in j else j
        c_prompt = rec["tokens"]
        c_gen = rec["generated"]["tokens"]
        py_prompt = tok.encode(p)
        # PyTorch: full forward over prompt + engine continuation, greedy check at each step
        seq = py_prompt + c_gen
        with torch.no_grad():
            logits = model(torch.tensor([seq]))[0][0].float()
        dmax = 0.0
        for pos in rec.get("positions", []):
            i = pos["pos"]
            for tid, val in pos["top"]:
                dmax = max(dmax, abs(float(logits[i, tid]) - val))
        # greedy reference continuation (independent of the engine)
        from generate import generate
        py_gen = generate(model, py_prompt, len(c_gen) if c_gen else a.max_tokens,
                          eos=cfg["eos_token_id"])
        match = py_gen == c_gen and py_prompt == c_prompt
        ok &= match
        print(f"=== {p!r}")
        print(f"prompt ids equal: {py_prompt == c_prompt} ({py_prompt} vs {c_prompt})")
        print(f"prompt logits: max |torch - colibri| over top-64 of {len(rec.get('positions', []))} "
              f"positions = {dmax:.3g}")
        print(f"greedy ids equal: {py_gen == c_gen} ({len(c_gen)} tokens)")
        print(f"  colibri: {tok.decode(c_gen)!r}")
        if py_gen != c_gen:
            k = next((i for i, (x, y) in enumerate(zip(py_gen, c_gen)) if x != y), min(len(py_gen), len(c_gen)))
            top2 = torch.topk(logits[len(py_prompt) - 1 + k], 2).values
            print(f"  torch  : {tok.decode(py_gen)!r}")
            print(f"  first difference at generated token {k}; torch top-2 margin there "
                  f"{float(top2[0] - top2[1]):.3g}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
