"""Byte-level BPE tokenizer (GPT-2 / Qwen2 style) trained from scratch, with a writer for the
Hugging Face ``tokenizer.json`` / ``tokenizer_config.json`` format.

Pre-tokenization is the Qwen2 regex, applied with the ``regex`` module (Debian
``python3-regex``), which supports ``\\p{L}`` / ``\\p{N}`` and the ``(?i:...)`` group exactly
like the Oniguruma / PCRE2 engines used by HF tokenizers and the C++ engine. Every
pre-token is mapped to its UTF-8 bytes, each byte to the GPT-2 printable unicode character,
and the merges are applied by rank (lowest first, leftmost on ties), i.e. the same result as
HF ``tokenizers`` ``models/bpe/word.rs`` with ``ignore_merges=false``.
"""
import heapq
import json
from collections import Counter, defaultdict

import regex

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PRETOK = regex.compile(QWEN2_PATTERN)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode char table (ordered as in GPT-2)."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
          + list(range(ord("®"), ord("ÿ") + 1)))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_ENCODER = bytes_to_unicode()
BYTE_DECODER = {c: b for b, c in BYTE_ENCODER.items()}


def pretokenize(text):
    return PRETOK.findall(text)


def to_byte_symbols(piece):
    return "".join(BYTE_ENCODER[b] for b in piece.encode("utf-8"))


def train_bpe(texts, vocab_size, n_special=len(SPECIAL_TOKENS), progress=None):
    """Learn merges until len(256 byte tokens + merges + specials) == vocab_size.

    Deterministic: the most frequent pair wins, ties broken by the lexicographically
    smallest (left, right) pair of symbol strings.
    """
    word_counts = Counter()
    for t in texts:
        word_counts.update(pretokenize(t))
    words = []   # list of symbol lists
    counts = []
    for w, c in sorted(word_counts.items()):
        words.append(list(to_byte_symbols(w)))
        counts.append(c)
    pair_count = defaultdict(int)
    pair_where = defaultdict(set)
    for i, syms in enumerate(words):
        for a, b in zip(syms, syms[1:]):
            pair_count[(a, b)] += counts[i]
            pair_where[(a, b)].add(i)
    # max-heap on count, then smallest pair: key (-count, a, b)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    n_merges = vocab_size - 256 - n_special
    merges = []
    while len(merges) < n_merges and heap:
        negc, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -negc or -negc <= 0:
            continue  # stale entry
        a, b = pair
        new = a + b
        merges.append(pair)
        changed = set()
        for i in sorted(pair_where.pop(pair, ())):
            syms = words[i]
            c = counts[i]
            # remove old pair counts of this word
            for p in zip(syms, syms[1:]):
                pair_count[p] -= c
                changed.add(p)
            j, out = 0, []
            while j < len(syms):
                if j + 1 < len(syms) and syms[j] == a and syms[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(syms[j])
                    j += 1
            words[i] = out
            for p in zip(out, out[1:]):
                pair_count[p] += c
                pair_where[p].add(i)
                changed.add(p)
        pair_count.pop(pair, None)
        for p in changed:
            c = pair_count.get(p, 0)
            if c > 0:
                heapq.heappush(heap, (-c, p))
            else:
                pair_count.pop(p, None)
        if progress and len(merges) % 500 == 0:
            progress(f"  {len(merges)} merges, last {new!r} count {-negc}")
    return merges


class Tokenizer:
    def __init__(self, merges):
        self.merges = [tuple(m) for m in merges]
        vocab = {}
        # GPT-2 order for the byte alphabet
        for ch in BYTE_ENCODER.values():
            vocab[ch] = len(vocab)
        for a, b in self.merges:
            vocab[a + b] = len(vocab)
        self.vocab = vocab
        self.special = {s: len(vocab) + i for i, s in enumerate(SPECIAL_TOKENS)}
        self.id_to_token = {i: t for t, i in vocab.items()}
        self.id_to_token.update({i: s for s, i in self.special.items()})
        self.ranks = {m: r for r, m in enumerate(self.merges)}
        self.eos_id = self.special["<|endoftext|>"]
        self._cache = {}
        self._special_re = regex.compile("(" + "|".join(regex.escape(s) for s in SPECIAL_TOKENS) + ")")

    @property
    def vocab_size(self):
        return len(self.vocab) + len(self.special)

    def _bpe(self, piece):
        cached = self._cache.get(piece)
        if cached is not None:
            return cached
        syms = list(to_byte_symbols(piece))
        ranks = self.ranks
        while len(syms) > 1:
            best, best_j = None, -1
            for j in range(len(syms) - 1):
                r = ranks.get((syms[j], syms[j + 1]))
                if r is not None and (best is None or r < best):
                    best, best_j = r, j
            if best is None:
                break
            syms[best_j:best_j + 2] = [syms[best_j] + syms[best_j + 1]]
        ids = [self.vocab[s] for s in syms]
        if len(self._cache) < 500000:
            self._cache[piece] = ids
        return ids

    def encode_ordinary(self, text):
        """Encode text, treating special-token strings as plain text."""
        ids = []
        for piece in pretokenize(text):
            ids.extend(self._bpe(piece))
        return ids

    def encode(self, text):
        """Encode text; special-token strings become their ids (like HF with specials)."""
        ids = []
        for part in self._special_re.split(text):
            if not part:
                continue
            if part in self.special:
                ids.append(self.special[part])
            else:
                ids.extend(self.encode_ordinary(part))
        return ids

    def decode(self, ids, skip_special=False):
        out = bytearray()
        for i in ids:
            t = self.id_to_token[i]
            if i in self.special.values():
                if not skip_special:
                    out += t.encode("utf-8")
            else:
                out += bytes(BYTE_DECODER[c] for c in t)
        return out.decode("utf-8", errors="replace")

    # ---------------------------------------------------------------- HF files
    def to_hf_json(self):
        added = [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True} for s, i in self.special.items()]
        bytelevel = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                     "use_regex": False}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated",
                 "invert": False},
                dict(bytelevel)]},
            "post_processor": dict(bytelevel),
            "decoder": dict(bytelevel),
            "model": {
                "type": "BPE", "dropout": None, "unk_token": None,
                "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": False,
                "byte_fallback": False, "ignore_merges": False,
                "vocab": self.vocab,
                "merges": [f"{a} {b}" for a, b in self.merges],
            },
        }

    def to_hf_config(self, model_max_length):
        return {
            "add_bos_token": False,
            "add_eos_token": False,
            "add_prefix_space": False,
            "added_tokens_decoder": {
                str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                         "single_word": False, "special": True}
                for s, i in self.special.items()},
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
            "bos_token": None,
            "chat_template": ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n'"
                              " + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
                              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"),
            "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>",
            "errors": "replace",
            "model_max_length": model_max_length,
            "pad_token": "<|endoftext|>",
            "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer",
            "unk_token": None,
        }

    def save(self, out_dir, model_max_length):
        import os
        with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(self.to_hf_json(), f, ensure_ascii=False, indent=2)
            f.write("\n")
        with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(self.to_hf_config(model_max_length), f, ensure_ascii=False, indent=2)
            f.write("\n")

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            j = json.load(f)
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in j["model"]["merges"]]
        tok = cls(merges)
        assert tok.vocab == j["model"]["vocab"], "vocab mismatch"
        return tok
