"""Writes a held-out excerpt for the test suite and the training script's own perplexity on it.

The suite cannot afford the whole held-out split (151k tokens) on every run, so it scores
the first documents of valid.txt, and this script records what the training script's
evaluation (train.evaluate: non-overlapping 256-token windows, every token but each
window's first predicted) gives on exactly that token stream.

    /usr/bin/python3 tools/train/eval_excerpt.py --valid /tmp/train-data/valid.txt \
        --model models/default --docs 3 --out tests/data/default-model

The excerpt joins the documents with the literal text <|endoftext|> and ends with it, so
that a tokenizer that parses special tokens yields the training stream exactly: each
document's ordinary tokens followed by the EOS id.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from mixtral import load_hf_dir  # noqa: E402
from train import evaluate, read_docs, to_stream  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--valid", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--docs", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()

    docs = read_docs(a.valid)[: a.docs]
    tok = bpe.Tokenizer.load(os.path.join(a.model, "tokenizer.json"))
    stream = to_stream(tok, docs)
    model, _ = load_hf_dir(a.model)
    ppl, predicted = evaluate(model, stream, a.ctx)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "heldout-excerpt.txt"), "w", encoding="utf-8") as f:
        f.write("".join(d + "<|endoftext|>" for d in docs))
    report = {
        "model": a.model,
        "documents": len(docs),
        "tokens": len(stream),
        "context": a.ctx,
        "predicted_tokens": predicted,
        "perplexity": ppl,
        "procedure": "train.evaluate: consecutive non-overlapping windows of ctx tokens, each from "
                     "position 0, every token but the window's first predicted; f32 arithmetic on "
                     "the saved bf16 weights",
        "token_ids_head": stream[:32].tolist(),
    }
    with open(os.path.join(a.out, "heldout-excerpt.json"), "w") as f:
        json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "token_ids_head"}, indent=2))


if __name__ == "__main__":
    main()
