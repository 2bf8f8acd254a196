#!/usr/bin/python3
"""make_gpt_weights.py OUT: one small GPT's weights in the layouts people have them, written by
following the published layouts (not by cddp), with PyTorch's logits for a batch, for
tests/gpt/weights_check.c:

- hf/model.safetensors + hf/config.json: Hugging Face's GPT2Model (names without "transformer.",
  Conv1D weights (in, out), each block's causal mask "h.N.attn.bias"); the logits of a PyTorch
  GPT built on Conv1D (y = x W + b) that reads the tensors as they are.
- hf_lm/model.safetensors: GPT2LMHeadModel's names ("transformer." and the tied "lm_head.weight"),
  no config.json.
- hf_bf16/model.safetensors + config.json: Hugging Face's layout in BF16 (its logits from the
  weights rounded to bf16); hf_f16/ the same in F16 (float16, as half the GPT-2 files people
  have; its logits from the weights rounded to float16); hf_sharded/ the float32 one in two
  shards with model.safetensors.index.json, as save_pretrained writes a model past
  max_shard_size, and two broken copies (a shard missing, a map that names the wrong shard).
- nanogpt.safetensors: nanoGPT's state_dict (nn.Linear's (out, in)), no metadata.
- gpt2.bin, gpt2_bf16.bin: llm.c's model files (magic 20240326, version 3 float32 and 5 bf16, the
  vocabulary padded to a multiple of 128 with zero rows); the bf16 one's logits from the same
  PyTorch GPT on the weights rounded to bf16.
- wrong files: hf_fc_linear (c_attn in Conv1D's orientation but mlp.c_fc in nn.Linear's), wide
  (a wider GPT: every shape differs) and wide.bin (the same in llm.c's layout), extra (a third
  block the model has not), untied (lm_head.weight not wte's).
- batch.safetensors: the tokens x (2, 16) and the logits of each good file.

make_gpt_weights.py --convert CHECKPOINT N_HEAD OUT: a GPT checkpoint of cddp's in Hugging Face's
layout (OUT/hf/model.safetensors and config.json) and llm.c's (OUT/gpt2.bin)."""
import json
import os
import struct
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
from nanogpt import TinyGPT  # noqa: E402

VOCAB, BLOCK, LAYERS, HEADS, WIDTH = 100, 16, 2, 4, 32
MATRICES = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def model(width=WIDTH, layers=LAYERS, seed=0):
    """A TinyGPT whose every tensor differs from the others (no LayerNorm of ones, no zero bias)."""
    torch.manual_seed(seed)
    m = TinyGPT(VOCAB, BLOCK, layers, HEADS, width)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def nanogpt_dict(m):
    return {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def shape_of(sd):
    """(vocab, block, layers, width) of a nanoGPT state_dict."""
    vocab, width = sd["transformer.wte.weight"].shape
    layers = 1 + max(int(k.split(".")[2]) for k in sd if k.startswith("transformer.h."))
    return vocab, sd["transformer.wpe.weight"].shape[0], layers, width


def hf_dict(sd, prefix="", head=False):
    """nanoGPT's state_dict in Hugging Face's layout: Conv1D weights transposed, the masks."""
    _, block, layers, _ = shape_of(sd)
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            if head:
                out[k] = v
            continue
        name = k[len("transformer."):]
        out[prefix + name] = v.T.copy() if name.endswith(MATRICES) else v
    for layer in range(layers):
        out[f"{prefix}h.{layer}.attn.bias"] = np.tril(np.ones((block, block), np.float32))[None, None]
    return out


def conv1d_logits(hf, x, prefix=""):
    """A GPT written on Conv1D, reading Hugging Face's tensors as they are."""
    t = {k: torch.from_numpy(np.array(v)) for k, v in hf.items()}
    g = lambda n: t[prefix + n]  # noqa: E731
    ln = lambda h, n: torch.nn.functional.layer_norm(h, (WIDTH,), g(n + ".weight"), g(n + ".bias"))  # noqa: E731
    conv = lambda h, n: h @ g(n + ".weight") + g(n + ".bias")  # noqa: E731
    B, T = x.shape
    h = g("wte.weight")[x] + g("wpe.weight")[torch.arange(T)]
    hs = WIDTH // HEADS
    for layer in range(LAYERS):
        p = f"h.{layer}."
        q, k, v = conv(ln(h, p + "ln_1"), p + "attn.c_attn").split(WIDTH, dim=2)
        q, k, v = (a.view(B, T, HEADS, hs).transpose(1, 2) for a in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / hs ** 0.5
        att = att.masked_fill(g(p + "attn.bias")[:, :, :T, :T] == 0, float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, WIDTH)
        h = h + conv(y, p + "attn.c_proj")
        f = torch.nn.functional.gelu(conv(ln(h, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh")
        h = h + conv(f, p + "mlp.c_proj")
    return ln(h, "ln_f") @ g("wte.weight").T


def llmc_write(path, sd, heads, version=3):
    """llm.c's model file: the header, then its sixteen tensors in its order."""
    vocab, block, layers, width = shape_of(sd)
    vp = (vocab + 127) // 128 * 128
    header = np.zeros(256, np.int32)
    header[:8] = [20240326, version, block, vocab, layers, heads, width, vp]
    wte = np.zeros((vp, width), np.float32)
    wte[:vocab] = sd["transformer.wte.weight"]
    per_layer = ["ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
                 "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
                 "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"]
    tensors = [wte, sd["transformer.wpe.weight"]]
    tensors += [np.stack([sd[f"transformer.h.{i}.{n}"] for i in range(layers)]) for n in per_layer]
    tensors += [sd["transformer.ln_f.weight"], sd["transformer.ln_f.bias"]]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for a in tensors:
            a = np.ascontiguousarray(a, np.float32)
            if version == 5:  # bf16: the top half of each float32, rounded to nearest even
                u = a.view(np.uint32).astype(np.uint64)
                u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
                f.write(u.tobytes())
            else:
                f.write(a.tobytes())


def bf16(a):
    return torch.from_numpy(a).to(torch.bfloat16).float().numpy()


def bf16_bits(a):
    """float32 array -> its bf16 bit patterns (uint16), rounded to nearest even as PyTorch does."""
    return (torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(torch.bfloat16)
            .view(torch.int16).numpy().view(np.uint16))


def convert(checkpoint, heads, out):
    """A cddp checkpoint's model in Hugging Face's and llm.c's layouts."""
    tensors, _ = safetensors_np.load(checkpoint)
    sd = {k: np.array(v) for k, v in tensors.items() if not k.startswith("optim.")}
    vocab, block, layers, width = shape_of(sd)
    os.makedirs(os.path.join(out, "hf"), exist_ok=True)
    safetensors_np.save(os.path.join(out, "hf", "model.safetensors"), hf_dict(sd))
    with open(os.path.join(out, "hf", "config.json"), "w") as f:
        json.dump({"model_type": "gpt2", "vocab_size": int(vocab), "n_positions": int(block),
                   "n_embd": int(width), "n_layer": layers, "n_head": heads}, f)
    llmc_write(os.path.join(out, "gpt2.bin"), sd, heads)


def main():
    if sys.argv[1] == "--convert":
        convert(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        return
    out = sys.argv[1]
    for d in ("hf", "hf_lm", "hf_bf16", "hf_f16", "hf_fc_linear", "wide", "extra", "untied", "nan",
              "broken_config", "headless_config"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
    m = model()
    sd = nanogpt_dict(m)
    x = torch.from_numpy(np.random.default_rng(1).integers(0, VOCAB, (2, BLOCK), dtype=np.int64))
    with torch.no_grad():
        want = m(x).numpy()
        hf = hf_dict(sd)
        got = conv1d_logits(hf, x).numpy()
    assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), "Conv1D and Linear disagree"
    config = {"model_type": "gpt2", "vocab_size": VOCAB, "n_positions": BLOCK, "n_embd": WIDTH,
              "n_layer": LAYERS, "n_head": HEADS}
    safetensors_np.save(os.path.join(out, "hf", "model.safetensors"), hf, {"format": "pt"})
    with open(os.path.join(out, "hf", "config.json"), "w") as f:
        json.dump(config, f)
    safetensors_np.save(os.path.join(out, "hf_lm", "model.safetensors"),
                        hf_dict(sd, "transformer.", head=True))
    safetensors_np.save(os.path.join(out, "nanogpt.safetensors"), sd)
    safetensors_np.save(os.path.join(out, "hf_bf16", "model.safetensors"),
                        {k: bf16_bits(v) for k, v in hf.items()})
    with open(os.path.join(out, "hf_bf16", "config.json"), "w") as f:
        json.dump(config, f)
    llmc_write(os.path.join(out, "gpt2.bin"), sd, HEADS)
    llmc_write(os.path.join(out, "gpt2_bf16.bin"), sd, HEADS, version=5)
    rounded = TinyGPT(VOCAB, BLOCK, LAYERS, HEADS, WIDTH)
    rounded.load_state_dict({k: torch.from_numpy(bf16(v)) for k, v in sd.items()})
    with torch.no_grad():
        want_bf16 = rounded(x).numpy()
    safetensors_np.save(os.path.join(out, "hf_f16", "model.safetensors"),
                        {k: v.astype(np.float16) for k, v in hf.items()})
    with open(os.path.join(out, "hf_f16", "config.json"), "w") as f:
        json.dump(config, f)
    rounded.load_state_dict({k: torch.from_numpy(v.astype(np.float16).astype(np.float32))
                             for k, v in sd.items()})
    with torch.no_grad():
        want_f16 = rounded(x).numpy()
    # the wrong ones
    bad = hf_dict(sd)
    bad["h.1.mlp.c_fc.weight"] = sd["transformer.h.1.mlp.c_fc.weight"]  # nn.Linear's (4C, C)
    safetensors_np.save(os.path.join(out, "hf_fc_linear", "model.safetensors"), bad)
    wide = nanogpt_dict(model(width=48))
    safetensors_np.save(os.path.join(out, "wide", "model.safetensors"), hf_dict(wide))
    with open(os.path.join(out, "wide", "config.json"), "w") as f:
        json.dump(dict(config, n_embd=48), f)
    llmc_write(os.path.join(out, "wide.bin"), wide, HEADS)
    extra = dict(hf)
    extra.update({k.replace("h.1.", "h.2."): v for k, v in hf.items() if k.startswith("h.1.")})
    safetensors_np.save(os.path.join(out, "extra", "model.safetensors"), extra)
    untied = hf_dict(sd, "transformer.", head=True)
    untied["lm_head.weight"] = untied["lm_head.weight"] + 1
    safetensors_np.save(os.path.join(out, "untied", "model.safetensors"), untied)
    nan = hf_dict(sd)
    nan["h.1.mlp.c_fc.weight"] = nan["h.1.mlp.c_fc.weight"].copy()
    nan["h.1.mlp.c_fc.weight"].flat[5] = np.nan
    nan["h.1.mlp.c_fc.weight"].flat[9] = np.inf
    safetensors_np.save(os.path.join(out, "nan", "model.safetensors"), nan)
    with open(os.path.join(out, "nan", "config.json"), "w") as f:
        json.dump(config, f)
    # sharded as save_pretrained shards: two files and the index of which holds what
    names = sorted(hf)
    shards = {"model-00001-of-00002.safetensors": names[:len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for d in ("hf_sharded", "sharded_missing", "sharded_wrong"):
        os.makedirs(os.path.join(out, d), exist_ok=True)
        weight_map = {n: f for f, ns in shards.items() for n in ns}
        for f, ns in shards.items():
            if d != "sharded_missing" or f.startswith("model-00001"):
                safetensors_np.save(os.path.join(out, d, f), {n: hf[n] for n in ns},
                                    {"format": "pt"})
        if d == "sharded_wrong":  # a tensor of the second shard said to be in the first
            weight_map["h.1.mlp.c_fc.weight"] = "model-00001-of-00002.safetensors"
        with open(os.path.join(out, d, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
        with open(os.path.join(out, d, "config.json"), "w") as f:
            json.dump(config, f)
    # config.json with a field that changes the computation (each refused, naming it), and
    # GPT-2's own values spelled out (accepted)
    fields = {"act_relu": {"activation_function": "relu"},
              "ln_eps": {"layer_norm_epsilon": 1e-6},
              "unscaled": {"scale_attn_weights": False},
              "layer_scaled": {"scale_attn_by_inverse_layer_idx": True},
              "inner": {"n_inner": 64},
              "llama_type": {"model_type": "llama"},
              "heads8": {"n_head": 8},  # loaded into a model of 4: refused
              "spelled_out": {"activation_function": "gelu_pytorch_tanh", "layer_norm_epsilon": 1e-5,
                              "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
                              "n_inner": None, "add_cross_attention": False, "resid_pdrop": 0.1}}
    for d, change in fields.items():
        os.makedirs(os.path.join(out, d), exist_ok=True)
        safetensors_np.save(os.path.join(out, d, "model.safetensors"), hf)
        with open(os.path.join(out, d, "config.json"), "w") as f:
            json.dump(dict(config, **change), f)
    # config.json cut short (not JSON), and one whose head count is a string
    for d, text in (("broken_config", json.dumps(config)[:-9]),
                    ("headless_config", json.dumps(dict(config, n_head="four")))):
        safetensors_np.save(os.path.join(out, d, "model.safetensors"), hf)
        with open(os.path.join(out, d, "config.json"), "w") as f:
            f.write(text)
    # llm.c's model file with another magic, and llm.c's token file, neither a model
    raw = open(os.path.join(out, "gpt2.bin"), "rb").read()
    open(os.path.join(out, "wrong_magic.bin"), "wb").write(struct.pack("<i", 20240327) + raw[4:])
    head = np.zeros(256, np.int32)
    head[:3] = [20240520, 1, 3]
    open(os.path.join(out, "tokens.bin"), "wb").write(head.tobytes() + struct.pack("<3H", 1, 2, 3))
    safetensors_np.save(os.path.join(out, "batch.safetensors"),
                        {"x": x.numpy(), "logits": want, "logits_bf16": want_bf16,
                         "logits_f16": want_f16})
    print(f"wrote a GPT (vocab {VOCAB}, block {BLOCK}, {LAYERS} layers, {HEADS} heads, width "
          f"{WIDTH}) in Hugging Face's, nanoGPT's and llm.c's layouts to {out}")


if __name__ == "__main__":
    main()
