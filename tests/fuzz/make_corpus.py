#!/usr/bin/env python3
"""make_corpus.py: writes the fuzz harnesses' seed corpora into tests/fuzz/corpus/<harness>/.

Small valid inputs of each format, and the reproducers of bugs found so far (named regress-*),
so that every corpus run is also a regression test. corpus/safetensors/ckpt (a checkpoint of
fuzz_safetensors.c's model with AdamW state, written by cddp_checkpoint_save) is committed as is.
"""
import gzip
import io
import json
import os
import struct
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))


def put(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def idx(type_code, dims, payload):
    return struct.pack(">BBBB", 0, 0, type_code, len(dims)) + b"".join(
        struct.pack(">I", d) for d in dims) + payload


def safetensors(header, data=b""):
    h = json.dumps(header).encode() if not isinstance(header, bytes) else header
    return struct.pack("<Q", len(h)) + h + data


def tokens(count, toks, magic=20240520, version=1):
    head = struct.pack("<3i", magic, version, count) + b"\0" * (1024 - 12)
    return head + struct.pack("<%dH" % len(toks), *toks)


def frame(kind, payload=b""):
    return b"CDDS" + struct.pack("<BBHI", 2, 0, kind, len(payload)) + payload


def field(b):
    return struct.pack("<I", len(b)) + b


# IDX: ubyte vector, int images, float, gzip; a header that asks for 16 GiB (regression).
put("idx", "ubyte-vector", idx(0x08, [3], b"\x01\x02\x03"))
put("idx", "ubyte-images", idx(0x08, [2, 2, 2], bytes(range(8))))
put("idx", "int-matrix", idx(0x0C, [2, 2], struct.pack(">4i", 1, -2, 3, -4)))
put("idx", "float-vector", idx(0x0D, [2], struct.pack(">2f", 1.5, -2.0)))
put("idx", "gzip", gzip.compress(idx(0x08, [4], b"abcd"), mtime=0))
put("idx", "regress-huge-dims", idx(0x08, [65536, 65536, 4], b"\0" * 16))

# safetensors: tensors with metadata; repeated keys and bad offsets (regressions).
two = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
       "b": {"dtype": "I64", "shape": [1], "data_offsets": [8, 16]},
       "__metadata__": {"epoch": "3", "note": "hi"}}
put("safetensors", "two-tensors", safetensors(two, struct.pack("<2fq", 1.0, 2.0, 7)))
put("safetensors", "regress-repeated-metadata", safetensors(
    b'{"__metadata__":{"a":"1"},"__metadata__":{"b":"2"},'
    b'"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
put("safetensors", "regress-repeated-name", safetensors(
    b'{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
    b'"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4))
put("safetensors", "regress-repeated-metadata-key", safetensors(
    b'{"__metadata__":{"a":"1","a":"2"}}'))
put("safetensors", "regress-offsets-past-end", safetensors(
    {"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 4))
put("safetensors", "regress-header-longer-than-file", struct.pack("<Q", 1 << 40) + b"{}")

# llm.c token files: three tokens; a count beyond the file (regression); a wrong magic.
put("tokens", "three", tokens(3, [1, 2, 255]))
put("tokens", "regress-count-past-end", tokens(1 << 30, [1, 2]))
put("tokens", "wrong-magic", tokens(1, [1], magic=1))

# A job's secret file (cddprun --token_file): a line, blanks and a second line, an empty line; a
# NUL byte in the line and a line too long are refused.
put("secret", "base64-line", b"c2VjcmV0LXRva2VuLXZhbHVl\n")
put("secret", "crlf-and-more", b"secret \r\nsecond line\n")
put("secret", "empty-line", b"\n")
put("secret", "regress-nul-in-line", b"abc\0def\n")
put("secret", "too-long", b"x" * 300)

# The store: a stranger's HELLO; with the token (first byte odd), every request, and an ADD that
# would overflow a 64-bit counter (regression).
put("store", "hello", b"\0" + frame(1, field(b"\0" * 16)))
put("store", "garbage", b"\0GET / HTTP/1.1\r\n\r\n")
requests = (frame(2, field(b"k") + field(b"v")) + frame(3, field(b"k")) +
            frame(5, field(b"k") + field(b"v") + field(b"w")) + frame(7) +
            frame(8, struct.pack("<QI", 0, 1) + field(b"k")) + frame(6, field(b"k")))
put("store", "requests", b"\1" + requests)
put("store", "regress-add-overflow", b"\1" + frame(4, field(b"n") + struct.pack("<q", 2**63 - 1)) +
    frame(4, field(b"n") + struct.pack("<q", 2**63 - 1)))
put("store", "wait-parked", b"\1" + frame(8, struct.pack("<QI", 60000, 1) + field(b"never")))

# NumPy's .npy files, laid out as np.save writes them: float32 images, int64 labels, uint8 in
# format version 2, float16 and bool; a structured array and a Fortran-order one (refused).


def npy(descr, shape, payload, version=1, fortran=False):
    dims = "".join("%d, " % d for d in shape).rstrip(" ")
    text = "{'descr': %s, 'fortran_order': %s, 'shape': (%s), }" % (
        descr if descr.startswith("[") else repr(descr), fortran, dims)
    head = 10 if version == 1 else 12
    pad = -(head + len(text) + 1) % 64
    text = (text + " " * pad + "\n").encode()
    size = struct.pack("<H", len(text)) if version == 1 else struct.pack("<I", len(text))
    return b"\x93NUMPY" + bytes([version, 0]) + size + text + payload


put("npy", "f4-images", npy("<f4", [2, 1, 2, 2], struct.pack("<8f", *range(8))))
put("npy", "i8-labels", npy("<i8", [3], struct.pack("<3q", 3, -1, 2**62)))
put("npy", "u1-version2", npy("|u1", [2, 3], bytes(range(6)), version=2))
put("npy", "f2-and-bool", npy("<f2", [2], struct.pack("<2e", 1.5, -0.25)))
put("npy", "b1", npy("|b1", [4], b"\1\0\1\1"))
put("npy", "structured", npy("[('a', '<f4')]", [1], b"\0" * 4))
put("npy", "fortran", npy("<f4", [2, 2], b"\0" * 16, fortran=True))
# A dimension of 67 digits, which overflowed while it was parsed (regression).
put("npy", "regress-shape-overflow", npy("<f4", [0, int("2" * 67), 2, 2], b""))

# .npz archives (np.savez: stored; np.savez_compressed: deflated) holding x.npy, as the harness
# reads them (PATH:x); and one holding y.npy alone.
def npz(members, method):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=method) as z:
        for name, payload in members:  # a fixed time: the same bytes at every run
            z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), payload,
                       compress_type=method)
    return buf.getvalue()


x_npy = npy("<f4", [2, 1, 2, 2], struct.pack("<8f", *range(8)))
put("npy", "npz-stored", npz([("x.npy", x_npy), ("y.npy", npy("<i8", [2], struct.pack("<2q", 1, 2)))],
                             zipfile.ZIP_STORED))
put("npy", "npz-deflated", npz([("x.npy", x_npy)], zipfile.ZIP_DEFLATED))
put("npy", "npz-without-x", npz([("y.npy", x_npy)], zipfile.ZIP_STORED))
# corpus/npy/regress-npz-claims-2gib (fuzz_npy's finding, committed as found): a deflated member of
# 95 bytes whose record claims 2 GiB, which was allocated before inflating; now refused by the
# deflate ratio.

# A safetensors file holding x (F32) and y (U8), read as PATH:x.
put("npy", "safetensors-x", safetensors(
    {"x": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
     "y": {"dtype": "U8", "shape": [2], "data_offsets": [16, 18]},
     "__metadata__": {"format": "pt"}}, struct.pack("<4f", 1, 2, 3, 4) + b"\1\2"))

# A GPT's weights as --init_from reads them (fuzz_gpt_weights.c): vocabulary 5, 4 positions, one
# layer of width 2 with 1 head; in llm.c's file (float32 and bf16, the vocabulary padded to 8), in
# Hugging Face's layout (Conv1D weights (in, out), the causal mask, the tied head) with the
# config.json the harness writes beside it (the bytes before the first NUL), and in nanoGPT's
# layout with cddp's metadata.
V, T, C, L, VP = 5, 4, 2, 1, 8
GPT = [("wte.weight", [V, C]), ("wpe.weight", [T, C])] + [
    ("h.0." + n, s) for n, s in [
        ("ln_1.weight", [C]), ("ln_1.bias", [C]), ("attn.c_attn.weight", [3 * C, C]),
        ("attn.c_attn.bias", [3 * C]), ("attn.c_proj.weight", [C, C]), ("attn.c_proj.bias", [C]),
        ("ln_2.weight", [C]), ("ln_2.bias", [C]), ("mlp.c_fc.weight", [4 * C, C]),
        ("mlp.c_fc.bias", [4 * C]), ("mlp.c_proj.weight", [C, 4 * C]), ("mlp.c_proj.bias", [C])]
] + [("ln_f.weight", [C]), ("ln_f.bias", [C])]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def values(n, at):
    return [((at + i) % 7 - 3) / 8 for i in range(n)]


def llmc_model(version, header=None):
    h = header or [20240326, version, T, V, L, 1, C, VP]
    out, at = b"", 0
    for name, shape in GPT:
        n = VP * C if name == "wte.weight" else numel(shape)
        vals = values(n, at)
        at += n
        if version == 3:
            out += struct.pack("<%df" % n, *vals)
        else:  # bf16: the upper half of each float32
            out += b"".join(struct.pack("<f", v)[2:] for v in vals)
    return struct.pack("<256i", *(h + [0] * (256 - len(h)))) + out


def st_model(prefix, conv1d, metadata=None, extra=()):
    header, data = {}, b""
    for name, shape in GPT:
        if conv1d and name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            shape = shape[::-1]
        vals = values(numel(shape), len(data) // 4)
        header[prefix + name] = {"dtype": "F32", "shape": shape,
                                 "data_offsets": [len(data), len(data) + 4 * len(vals)]}
        data += struct.pack("<%df" % len(vals), *vals)
    for name, shape, payload in extra:
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    if metadata:
        header["__metadata__"] = metadata
    return safetensors(header, data)


put("gpt_weights", "llmc-f32", llmc_model(3))
put("gpt_weights", "llmc-bf16", llmc_model(5))
hf_config = json.dumps({"model_type": "gpt2", "n_head": 1, "n_embd": C, "n_layer": L,
                        "n_positions": T, "vocab_size": V}).encode()
wte = struct.pack("<%df" % (V * C), *values(V * C, 0))
put("gpt_weights", "hf-pair", hf_config + b"\0" + st_model(
    "transformer.", True, extra=[("transformer.h.0.attn.bias", [1, 1, T, T], b"\0" * 4 * T * T),
                                 ("lm_head.weight", [V, C], wte)]))
put("gpt_weights", "nanogpt-meta", st_model("transformer.", False, metadata={
    "vocab_size": str(V), "block_size": str(T), "n_layer": str(L), "n_head": "1",
    "n_embd": str(C)}))
# Hugging Face's sharded layout: the index, then its one shard (a.safetensors).
put("gpt_weights", "hf-sharded", b"!" + json.dumps({"weight_map": {
    n: "a.safetensors" for n, _ in GPT}}).encode() + b"\0" + st_model("", True))
# An llm.c header whose sizes multiply past 64 bits: its size check wrapped (regression).
put("gpt_weights", "regress-llmc-size-overflow",
    llmc_model(3, [20240326, 3, 2**31 - 1, 1, 2**31 - 1, 1, 2**30, 2**31 - 1])[:1024])

# Tokenizers (fuzz_tokenizer.c): a byte-level BPE tokenizer.json (GPT-2's pre-tokenizer; and
# Llama 3's Split, Digits and added tokens), and GPT-2's vocab.json + merges.txt, each followed by
# text to encode.


def byte_level():
    """The printable character byte-level BPE writes for each byte."""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


BL = byte_level()
VOCAB = {BL[b]: b for b in range(256)}
MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n")]
for a, b in MERGES:
    VOCAB[a + b] = len(VOCAB)
TEXT = "The theme: then, in 1999 <|endoftext|> Ünïcödé  \t\n".encode()


def tokenizer_json(pre, added=(), model=None):
    m = {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
         "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
         "vocab": VOCAB, "merges": [a + " " + b for a, b in MERGES]}
    m.update(model or {})
    return json.dumps({"version": "1.0", "added_tokens": list(added), "normalizer": None,
                       "pre_tokenizer": pre, "post_processor": None,
                       "decoder": {"type": "ByteLevel"}, "model": m}).encode()


EOT = {"id": len(VOCAB), "content": "<|endoftext|>", "single_word": False, "lstrip": False,
       "rstrip": False, "normalized": False, "special": True}
put("tokenizer", "gpt2", tokenizer_json(
    {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}, [EOT]) + b"\0" + TEXT)
put("tokenizer", "llama3", tokenizer_json({"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}| ?\\p{L}+|\\s+"}, "behavior": "Isolated",
     "invert": False},
    {"type": "Digits", "individual_digits": True},
    {"type": "ByteLevel", "add_prefix_space": True, "use_regex": False}]},
    [dict(EOT, lstrip=True, rstrip=True)], {"ignore_merges": True, "merges": [list(m) for m in MERGES]})
    + b"\0" + TEXT)
put("tokenizer", "gpt2-files", b"V" + json.dumps(dict(VOCAB, **{"<|endoftext|>": len(VOCAB)})).encode()
    + b"\0#version: 0.2\n" + "\n".join(a + " " + b for a, b in MERGES).encode() + b"\0" + TEXT)
