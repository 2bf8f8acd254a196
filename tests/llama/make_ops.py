"""Hugging Face's Llama pieces as the reference for cddp's ops: transformers' own LlamaRMSNorm,
LlamaRotaryEmbedding with apply_rotary_pos_emb (default frequencies and Llama 3's rope_scaling),
LlamaMLP's act_fn(gate) * up, and grouped-query attention through repeat_kv, on random inputs, in float64 then rounded to float32, with the
gradients of sum(out * R) for a random R.

Usage: make_ops.py OUT.safetensors
Writes, per case, the inputs, R, the output and each input's gradient; ops_check.c computes the
same with cddp_rms_norm, cddp_rope and cddp_silu_mul and compares.
"""
import sys

import numpy as np
import torch
from transformers import LlamaConfig
from transformers.activations import ACT2FN
from transformers.models.llama.modeling_llama import (LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb, repeat_kv)

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/reference")
import safetensors_np  # noqa: E402

torch.manual_seed(0)
out = {}


def put(prefix, **tensors):
    for k, v in tensors.items():
        out[f"{prefix}.{k}"] = v.detach().to(torch.float32).numpy().copy()


def leaf(*shape):
    return torch.randn(*shape, dtype=torch.float64).requires_grad_()


# RMSNorm: x (B, T, C), its weight, eps 1e-6 (Llama 3's) and 1e-5 (Llama 2's)
for name, eps in (("rms", 1e-6), ("rms5", 1e-5)):
    x, w = leaf(2, 5, 24), leaf(24)
    norm = LlamaRMSNorm(24, eps=eps).double()
    norm.weight = torch.nn.Parameter(w.detach().clone())
    y = norm(x)
    R = torch.randn_like(y)
    (y * R).sum().backward()
    put(name, x=x, w=norm.weight, R=R, y=y, dx=x.grad, dw=norm.weight.grad,
        eps=torch.tensor([eps]))

# SwiGLU: act_fn(gate) * up with Llama's act (silu)
g, u = leaf(3, 4, 40), leaf(3, 4, 40)
y = ACT2FN["silu"](g) * u
R = torch.randn_like(y)
(y * R).sum().backward()
put("swiglu", g=g, u=u, R=R, y=y, dg=g.grad, du=u.grad)

# Rotary positions on q (B, T, H D) from position pos0, as the attention applies them (heads first
# there: (B, H, T, D)); Llama 2's default frequencies, and Llama 3's scaled ones (theta 500000)
for name, scaling, theta, pos0 in (("rope", None, 10000.0, 0), ("rope3", {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192}, 500000.0, 9000)):
    B, T, H, D = 2, 6, 3, 16
    cfg = LlamaConfig(hidden_size=H * D, num_attention_heads=H, rope_theta=theta,
                      rope_scaling=scaling, max_position_embeddings=16384)
    rot = LlamaRotaryEmbedding(config=cfg)
    x = leaf(B, T, H * D)
    pos = torch.arange(pos0, pos0 + T)[None].expand(B, T)
    cos, sin = rot(x.float(), pos)
    q = x.view(B, T, H, D).transpose(1, 2)
    y, _ = apply_rotary_pos_emb(q, q, cos.double(), sin.double())
    y = y.transpose(1, 2).reshape(B, T, H * D)
    R = torch.randn_like(y)
    (y * R).sum().backward()
    put(name, x=x, inv_freq=rot.inv_freq, R=R, y=y, dx=x.grad,
        meta=torch.tensor([H, pos0], dtype=torch.float64))

# Grouped-query attention as LlamaAttention's eager path computes it: k and v of KV heads
# repeated (repeat_kv) for H query heads, causal softmax(q k^T / sqrt(D)) v; 4 heads with 2 and
# with 1 (multi-query) key/value heads; rows (B, T, heads D) as the projections give them
for name, KV in (("gqa", 2), ("mqa", 1)):
    B, T, H, D = 2, 5, 4, 8
    q, k, v = leaf(B, T, H * D), leaf(B, T, KV * D), leaf(B, T, KV * D)
    heads = lambda t, n: t.view(B, T, n, D).transpose(1, 2)  # noqa: E731
    kk, vv = repeat_kv(heads(k, KV), H // KV), repeat_kv(heads(v, KV), H // KV)
    w = heads(q, H) @ kk.transpose(2, 3) / D ** 0.5
    w = w.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    y = (w @ vv).transpose(1, 2).reshape(B, T, H * D)
    R = torch.randn_like(y)
    (y * R).sum().backward()
    put(name, q=q, k=k, v=v, R=R, y=y, dq=q.grad, dk=k.grad, dv=v.grad,
        meta=torch.tensor([H, KV], dtype=torch.float64))

safetensors_np.save(sys.argv[1], out)
print(f"wrote {len(out)} tensors to {sys.argv[1]}")
