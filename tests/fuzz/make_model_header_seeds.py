#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_model_headers (tests/fuzz/corpus/model_headers;
the fixtures' config.json files there are plain copies):
small, valid GGUF and safetensors images that reach every part of the readers
(each GGUF value type, tensors of several ggml types and of every decoded
block type, alignment; several
safetensors dtypes, metadata, an empty tensor), and the metadata of a real
GGUF fixture with tiny tensors in place of its weights.

    python3 tests/fuzz/make_model_header_seeds.py [FIXTURE.gguf]
"""
import json
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "model_headers")

# GGUF value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
          U64: "<Q", I64: "<q", F64: "<d"}


def gstr(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    if t == STRING:
        return gstr(v)
    if t == ARRAY:
        et, items = v
        out = struct.pack("<IQ", et, len(items))
        for item in items:
            out += value(et, item)
        return out
    return struct.pack(SCALAR[t], v)


def kv(key, t, v):
    return gstr(key) + struct.pack("<I", t) + value(t, v)


def gguf(kvs_raw, n_kv, tensors, alignment=32):
    """tensors: (name, ne list, ggml type, data bytes)"""
    infos, data = b"", b""
    for name, ne, ggml_type, payload in tensors:
        data += b"\0" * (-len(data) % alignment)
        infos += gstr(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        infos += struct.pack("<IQ", ggml_type, len(data))
        data += payload
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kvs_raw + infos
    head += b"\0" * (-len(head) % alignment)
    return head + data


def f16(x):
    return struct.pack("<e", x)


def q8_0_block(values):
    scale = max(abs(v) for v in values) / 127 or 1.0
    return f16(scale) + b"".join(struct.pack("<b", round(v / scale)) for v in values)


def tiny_tensors():
    return [
        ("a.f32", [8], 0, struct.pack("<8f", *range(8))),
        ("b.f16", [4, 2], 1, b"".join(f16(x / 4) for x in range(8))),
        ("c.q8_0", [32], 8, q8_0_block([((i * 7) % 13 - 6) / 3 for i in range(32)])),
        ("d.bf16", [4], 30, b"".join(struct.pack("<f", x)[2:] for x in (1.0, -2.0, 0.5, 3.0))),
    ]


def block_tensors():
    """One tensor of each block type format/ggml_blocks.cpp decodes: codes from a
    fixed byte pattern, every f16 scale field set to a small finite value."""
    types = [  # (name, ggml type, values per block, bytes per block, offsets of f16 fields)
        ("q4_0", 2, 32, 18, [0]), ("q4_1", 3, 32, 20, [0, 2]), ("q5_0", 6, 32, 22, [0]),
        ("q5_1", 7, 32, 24, [0, 2]), ("q2_k", 10, 256, 84, [80, 82]), ("q3_k", 11, 256, 110, [108]),
        ("q4_k", 12, 256, 144, [0, 2]), ("q5_k", 13, 256, 176, [0, 2]), ("q6_k", 14, 256, 210, [208]),
    ]
    tensors = []
    for name, ggml_type, block, size, halves in types:
        data = bytearray((i * 37 + 11) % 256 for i in range(2 * size))
        for b in range(2):
            for at in halves:
                data[b * size + at:b * size + at + 2] = f16(0.25 * (b + 1))
        tensors.append(("blk." + name, [block * 2], ggml_type, bytes(data)))
    return tensors


def write(name, data):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)


def main():
    os.makedirs(OUT, exist_ok=True)
    kvs = [
        ("general.architecture", STRING, "olmoe"),
        ("general.alignment", U32, 32),
        ("olmoe.block_count", U32, 2),
        ("olmoe.embedding_length", U64, 64),
        ("olmoe.expert_count", I32, 4),
        ("olmoe.expert_used_count", U16, 2),
        ("olmoe.rope.freq_base", F32, 10000.0),
        ("olmoe.attention.layer_norm_rms_epsilon", F64, 1e-5),
        ("a.u8", U8, 7), ("a.i8", I8, -7), ("a.i16", I16, -300), ("a.i64", I64, -(1 << 40)),
        ("a.bool", BOOL, True),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, ["<s>", "</s>", "a", "b", "ab"])),
        ("tokenizer.ggml.scores", ARRAY, (F32, [0.0, 0.0, -1.0, -2.0, -3.0])),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [3, 3, 1, 1, 1])),
        ("a.nested", ARRAY, (ARRAY, [(U8, [1, 2]), (STRING, ["x"])])),
    ]
    raw = b"".join(kv(*item) for item in kvs)
    write("gguf-types.gguf", gguf(raw, len(kvs), tiny_tensors()))
    kvs64 = [("general.alignment", U32, 64), ("general.architecture", STRING, "llama")]
    q4_k = ("e.q4_k", [256], 12, bytes(range(144)))
    write("gguf-align64.gguf", gguf(b"".join(kv(*item) for item in kvs64), len(kvs64), tiny_tensors()[:1] + [q4_k], 64))
    write("gguf-empty.gguf", gguf(b"", 0, []))
    write("gguf-blocks.gguf", gguf(b"", 0, block_tensors()))

    st_header = {
        "__metadata__": {"format": "pt"},
        "w.f32": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "w.f16": {"dtype": "F16", "shape": [4], "data_offsets": [24, 32]},
        "w.bf16": {"dtype": "BF16", "shape": [2], "data_offsets": [32, 36]},
        "w.empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [36, 36]},
    }
    header = json.dumps(st_header).encode()
    header += b" " * (-len(header) % 8)
    data = struct.pack("<6f", *range(6)) + b"".join(f16(x) for x in (1, 2, 3, 4)) + struct.pack("<f", 1.5)[2:] * 2
    write("st-types.safetensors", struct.pack("<Q", len(header)) + header + data)
    header = json.dumps({"x": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}}).encode()
    write("st-scalar.safetensors", struct.pack("<Q", len(header)) + header + struct.pack("<f", 2.0))

    if len(sys.argv) > 1:  # a real fixture's metadata, its tensors replaced by tiny ones
        blob = open(sys.argv[1], "rb").read()
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", blob, 0)
        assert magic == b"GGUF"
        at = 24
        def skip_value(t, at):
            if t == STRING:
                (n,) = struct.unpack_from("<Q", blob, at)
                return at + 8 + n
            if t == ARRAY:
                et, n = struct.unpack_from("<IQ", blob, at)
                at += 12
                for _ in range(n):
                    at = skip_value(et, at)
                return at
            return at + struct.calcsize(SCALAR[t])
        start = at
        for _ in range(n_kv):
            (n,) = struct.unpack_from("<Q", blob, at)
            at += 8 + n
            (t,) = struct.unpack_from("<I", blob, at)
            at = skip_value(t, at + 4)
        write("gguf-fixture-metadata.gguf", gguf(blob[start:at], n_kv, tiny_tensors()))


if __name__ == "__main__":
    main()
