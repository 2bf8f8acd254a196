"""Hugging Face's LlamaForCausalLM as the reference for cddp's Llama: small random models saved
as save_pretrained saves them (model.safetensors and config.json), with their logits on a batch,
the cross-entropy loss against targets and the gradient of every parameter.

Usage: make_model.py OUTDIR
Writes OUTDIR/<case>/{model.safetensors, config.json, reference.safetensors} for the cases:
gqa (4 heads, 2 key/value heads, untied head, Llama 2's rotary frequencies) and mqa (4 heads, 1
key/value head, tied head, Llama 3's rope_scaling and rms_norm_eps 1e-6); gqa's model saved in
bfloat16 (gqa_bf16) and float16 (gqa_f16), their references those of the rounded weights, and in
shards of 40 KB with model.safetensors.index.json (gqa_sharded); and OUTDIR/refused/
<what>/config.json, gqa's with one field that cddp does not compute, each with the words its
refusal must say in OUTDIR/refusals.
"""
import json
import copy
import os
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_np  # noqa: E402

out = sys.argv[1]
GQA = dict(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=10000.0,
           rms_norm_eps=1e-5)
CASES = {
    "gqa": GQA, "gqa_bf16": GQA, "gqa_f16": GQA, "gqa_sharded": GQA,
    "mqa": dict(num_key_value_heads=1, tie_word_embeddings=True, rope_theta=10000.0,
                rms_norm_eps=1e-6, rope_scaling={
                    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
}
for name, extra in CASES.items():
    torch.manual_seed(len(name.split("_")[0]))
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, max_position_embeddings=128, **extra)
    m = LlamaForCausalLM(cfg).float().eval()
    with torch.no_grad():  # weights of a model that trained a little: not all of one size
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    d = os.path.join(out, name)
    half = {"bf16": torch.bfloat16, "f16": torch.float16}.get(name.split("_")[-1])
    if half:  # the file holds the weights rounded; the reference is computed from them
        with torch.no_grad():
            for p in m.parameters():
                p.copy_(p.to(half).float())
        copy.deepcopy(m).to(half).save_pretrained(d, safe_serialization=True)
    else:
        m.save_pretrained(d, safe_serialization=True,
                          max_shard_size="40KB" if name.endswith("sharded") else "5GB")
    x = torch.randint(0, 64, (2, 12))
    y = torch.randint(0, 64, (2, 12))
    logits = m(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), y.reshape(-1))
    loss.backward()
    ref = {"x": x.numpy(), "y": y.numpy(), "logits": logits.detach().numpy(),
           "loss": loss.detach().reshape(1).numpy()}
    m.generation_config.eos_token_id = None  # 12 tokens, whatever they are
    for n, p in m.named_parameters():
        ref["grad." + n] = p.grad.numpy()
    prompt = torch.tensor([[1, 2, 3]])  # greedy generation, as generate(do_sample=False) draws
    with torch.no_grad():
        ids = m.generate(prompt, do_sample=False, max_new_tokens=12, min_new_tokens=12,
                         attention_mask=torch.ones_like(prompt), pad_token_id=0)
    ref["gen"] = ids[0].numpy()
    safetensors_np.save(os.path.join(d, "reference.safetensors"), ref)
    print(f"{name}: loss {loss.item():.6f}, {len(ref) - 4} gradients")

base = json.load(open(os.path.join(out, "gqa", "config.json")))
REFUSED = {
    "act": ({"hidden_act": "gelu"}, "hidden_act gelu"),
    "attention_bias": ({"attention_bias": True}, "attention_bias is true"),
    "mlp_bias": ({"mlp_bias": True}, "mlp_bias is true"),
    "head_dim": ({"head_dim": 16}, "head_dim 16"),
    "scaling": ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "rope_scaling of type linear"),
    "window": ({"model_type": "mistral", "sliding_window": 64}, "sliding_window 64"),
    "type": ({"model_type": "gpt2"}, "model_type gpt2"),
    "kv": ({"num_key_value_heads": 3}, "do not share 3 key/value heads"),
}
lines = []
for what, (change, words) in REFUSED.items():
    d = os.path.join(out, "refused", what)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(dict(base, **change), f)
    lines.append(f"refused/{what}\t{words}")
with open(os.path.join(out, "refusals"), "w") as f:
    f.write("\n".join(lines) + "\n")
