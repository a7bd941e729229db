"""A small Mixtral (Hugging Face ``MixtralForCausalLM`` semantics) in plain PyTorch, plus a
hand-written safetensors reader / writer (Debian has no ``python3-safetensors``).

Semantics follow transformers' ``modeling_mixtral.py``:
  * RMSNorm: ``w * x * rsqrt(mean(x^2) + eps)`` computed in float32.
  * RoPE, rotate-half convention, ``inv_freq = theta ** (-arange(0, d, 2) / d)``, positions 0..T-1.
  * GQA attention (no biases), scale ``1/sqrt(head_dim)``, causal.
  * Sparse MoE block: router ``gate`` (no bias) -> softmax over all experts (float32) -> top-k
    -> renormalised to sum 1 -> sum_k w_k * expert_k(x); expert = ``w2(silu(w1 x) * w3 x)``.
  * Pre-norm residual blocks, final norm, ``lm_head`` (optionally tied to ``embed_tokens``).
"""
import json
import math
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Rope:
    def __init__(self, head_dim, theta):
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.cache = {}

    def get(self, start, T):
        key = (start, T)
        if key not in self.cache:
            pos = torch.arange(start, start + T, dtype=torch.float64)
            freqs = torch.outer(pos, self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self.cache = {key: (emb.cos().float(), emb.sin().float())}
        return self.cache[key]


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.nh, self.nkv, self.hd = c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        H = c["hidden_size"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)

    def forward(self, x, cos, sin, kv_cache=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        if kv_cache is not None:
            if "k" in kv_cache:
                k = torch.cat((kv_cache["k"], k), dim=2)
                v = torch.cat((kv_cache["v"], v), dim=2)
            kv_cache["k"], kv_cache["v"] = k, v
        S = k.shape[2]
        rep = self.nh // self.nkv
        # GQA without materialising repeated K/V: query head h uses kv head h // rep (HF
        # repeat_kv), so group the rep query heads of one kv head along the time axis.
        qg = (q * (1.0 / math.sqrt(self.hd))).reshape(B, self.nkv, rep * T, self.hd)
        att = (qg @ k.transpose(-1, -2)).view(B, self.nkv, rep, T, S)
        if T > 1:
            mask = torch.ones(T, S, dtype=torch.bool).tril(diagonal=S - T)
            att = att.masked_fill(~mask, float("-inf"))
        att = torch.softmax(att, dim=-1).view(B, self.nkv, rep * T, S)
        y = (att @ v).view(B, self.nh, T, self.hd).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(y)


class SparseMoE(nn.Module):
    """Experts are stored stacked: w1/w3 [E, ff, H], w2 [E, H, ff] (== HF per-expert Linear weights)."""

    def __init__(self, c):
        super().__init__()
        H, ff, E = c["hidden_size"], c["intermediate_size"], c["num_local_experts"]
        self.E, self.k = E, c["num_experts_per_tok"]
        self.gate = nn.Linear(H, E, bias=False)
        self.w1 = nn.Parameter(torch.empty(E, ff, H))
        self.w3 = nn.Parameter(torch.empty(E, ff, H))
        self.w2 = nn.Parameter(torch.empty(E, H, ff))

    def forward(self, x):
        B, T, H = x.shape
        xf = x.reshape(-1, H)
        logits = self.gate(xf)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        topw, topi = probs.topk(self.k, dim=-1)
        topw = (topw / topw.sum(-1, keepdim=True)).to(x.dtype)
        flat_e = topi.reshape(-1)
        order = torch.argsort(flat_e, stable=True)
        counts = torch.bincount(flat_e, minlength=self.E).tolist()
        tok = order // self.k
        w = topw.reshape(-1)[order]
        xs = xf[tok]
        outs, s = [], 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            seg = xs[s:s + n]
            h = F.silu(seg @ self.w1[e].t()) * (seg @ self.w3[e].t())
            outs.append(h @ self.w2[e].t())
            s += n
        ys = torch.cat(outs) * w[:, None]
        out = torch.zeros_like(xf).index_add_(0, tok, ys)
        # Switch/HF load-balancing statistics for this layer
        frac = F.one_hot(topi, self.E).float().mean(0)      # [k, E]
        pmean = probs.mean(0)                                # [E]
        aux = (frac * pmean[None]).sum() * self.E
        return out.view(B, T, H), aux, torch.bincount(flat_e, minlength=self.E)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.block_sparse_moe = SparseMoE(c)

    def forward(self, x, cos, sin, kv_cache=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv_cache)
        y, aux, cnt = self.block_sparse_moe(self.post_attention_layernorm(x))
        return x + y, aux, cnt


class Mixtral(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Block(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.lm_head = None if c["tie_word_embeddings"] else nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        self.rope = Rope(c["head_dim"], c["rope_theta"])

    def init_weights(self, std=0.02):
        """Normal(0, std) for all matrices (HF initializer_range); residual output projections
        (o_proj, w2) additionally scaled by 1/sqrt(2 * layers) (GPT-2 style); norms = 1."""
        scaled = std / math.sqrt(2 * self.c["num_hidden_layers"])
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith(".w2"):
                nn.init.normal_(p, 0.0, scaled)
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(self, ids, start_pos=0, kv_caches=None):
        x = self.embed_tokens(ids)
        cos, sin = self.rope.get(start_pos, ids.shape[1])
        auxes, counts = [], []
        for i, layer in enumerate(self.layers):
            x, aux, cnt = layer(x, cos, sin, None if kv_caches is None else kv_caches[i])
            auxes.append(aux)
            counts.append(cnt)
        x = self.norm(x)
        w = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return x @ w.t(), torch.stack(auxes).mean(), torch.stack(counts)

    # ------------------------------------------------------------ HF tensor names
    def hf_state_dict(self):
        out = {"model.embed_tokens.weight": self.embed_tokens.weight, "model.norm.weight": self.norm.weight}
        if self.lm_head is not None:
            out["lm_head.weight"] = self.lm_head.weight
        for L, b in enumerate(self.layers):
            p = f"model.layers.{L}."
            out[p + "input_layernorm.weight"] = b.input_layernorm.weight
            out[p + "post_attention_layernorm.weight"] = b.post_attention_layernorm.weight
            for n in ("q", "k", "v", "o"):
                out[p + f"self_attn.{n}_proj.weight"] = getattr(b.self_attn, f"{n}_proj").weight
            m = b.block_sparse_moe
            out[p + "block_sparse_moe.gate.weight"] = m.gate.weight
            for e in range(m.E):
                for wn in ("w1", "w2", "w3"):
                    out[p + f"block_sparse_moe.experts.{e}.{wn}.weight"] = getattr(m, wn)[e]
        return {k: v.detach() for k, v in out.items()}

    def load_hf_state_dict(self, sd):
        with torch.no_grad():
            mine = self.hf_state_dict()
            missing = set(mine) - set(sd)
            extra = set(sd) - set(mine)
            if missing or extra:
                raise ValueError(f"missing {sorted(missing)[:5]} extra {sorted(extra)[:5]}")
            for k, v in mine.items():  # views into the parameters -> copy_ writes through
                if tuple(v.shape) != tuple(sd[k].shape):
                    raise ValueError(f"{k}: shape {tuple(sd[k].shape)} != {tuple(v.shape)}")
                v.copy_(sd[k].to(v.dtype))


# ---------------------------------------------------------------- safetensors
_DT = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float16: "F16"}
_DT_INV = {v: k for k, v in _DT.items()}


def save_safetensors(path, tensors, metadata=None):
    """8-byte LE header length, JSON header (sorted tensor names, data_offsets relative to the
    data section), header padded with spaces to a multiple of 8, raw little-endian data."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        raw = t.view(torch.int16).numpy().tobytes() if t.dtype in (torch.bfloat16, torch.float16) \
            else t.numpy().tobytes()
        header[name] = {"dtype": _DT[t.dtype], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hj = json.dumps(header, separators=(",", ":")).encode()
    hj += b" " * ((8 - len(hj) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hj)))
        f.write(hj)
        for b in blobs:
            f.write(b)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dt = _DT_INV[info["dtype"]]
        buf = bytearray(data[base + a:base + b])
        if dt in (torch.bfloat16, torch.float16):
            t = torch.frombuffer(buf, dtype=torch.int16).view(dt)
        else:
            t = torch.frombuffer(buf, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def load_hf_dir(d):
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    model = Mixtral(cfg)
    model.load_hf_state_dict({k: v.float() for k, v in load_safetensors(f"{d}/model.safetensors").items()})
    return model.eval(), cfg
