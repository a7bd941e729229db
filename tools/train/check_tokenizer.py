#!/usr/bin/python3
"""Compare this directory's Python BPE encoder with the JS Hugging Face tokenizer.

    cd /tmp/train-data && npm install @huggingface/tokenizers     # outside the repo
    /usr/bin/python3 tools/train/check_tokenizer.py --model models/default \
        --valid /tmp/train-data/valid.txt --node-modules /tmp/train-data/node_modules

Cases: every non-empty line of the held-out file (up to --max-lines), the first held-out
documents whole (multi-line, with blank lines), and hand-written edge cases (contractions,
digits, whitespace runs, non-ASCII, special tokens). The Python ids come from the
tokenizer.json in --model (reloaded, not the training-time object).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

EDGE = [
    "And God said, Let there be light: and there was light.",
    "I'm sure he'd've said THEY'LL come; it's John's, isn't it? We'RE 'Tis 'S",
    "In 1961, $1,234.56 was 12% of 3/4 -- or so (approx.) #42 @home",
    "tabs\tand  double  spaces   and trailing   \n\n\n  indented\r\nline  ",
    "Unicode: café naïve Zürich — “quoted” ‘single’ … 東京 москва 😀 ½ ²",
    "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
    "end of text<|endoftext|>next",
    "   ", "\n", "a", "", "...!!!???", "don't DON'T Don't", "x\u00a0y\u2003z",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--valid", default=os.environ.get("VALID_FILE", "/tmp/train-data/valid.txt"))
    ap.add_argument("--node-modules", default="/tmp/train-data/node_modules")
    ap.add_argument("--max-lines", type=int, default=100000)
    ap.add_argument("--docs", type=int, default=10)
    a = ap.parse_args()
    tok = bpe.Tokenizer.load(os.path.join(a.model, "tokenizer.json"))
    with open(a.valid, encoding="utf-8") as f:
        raw = f.read()
    lines = [ln for ln in raw.split("\n") if ln.strip() and ln != "<|endoftext|>"][:a.max_lines]
    docs = raw.split("\n<|endoftext|>\n")[:a.docs]
    texts = lines + docs + EDGE
    cases = [{"text": t, "ids": tok.encode(t)} for t in texts]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
    print(f"{len(lines)} held-out lines, {len(docs)} whole documents, {len(EDGE)} edge cases")
    r = subprocess.run(["node", os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_tokenizer.mjs"),
                        a.node_modules, a.model, f.name])
    os.unlink(f.name)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
