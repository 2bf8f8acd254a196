"""nanogpt.py: the GPT of nanoGPT (and of llm.c's PyTorch reference) in PyTorch, as cddp's
tests and benchmarks compare with it: pre-LN blocks with causal self-attention written out
(PyTorch 1.13 has no fused attention), a 4x MLP with GELU-tanh, a final LayerNorm and the
language-model head tied to the token embedding; GPT-2's initialisation; nanoGPT's learning-rate
schedule (get_lr) and its AdamW parameter groups (optimizer)."""
import math

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, c, heads, block):
        super().__init__()
        self.heads = heads
        # the causal mask, made once as nanoGPT's "bias" buffer (not part of the state_dict)
        self.register_buffer("mask", torch.tril(torch.ones(block, block)), persistent=False)
        self.ln_1 = nn.LayerNorm(c)
        self.attn = nn.Module()
        self.attn.c_attn = nn.Linear(c, 3 * c)
        self.attn.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.mlp = nn.Module()
        self.mlp.c_fc = nn.Linear(c, 4 * c)
        self.mlp.c_proj = nn.Linear(4 * c, c)

    def attention(self, x):
        B, T, C = x.shape
        q, k, v = self.attn.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / (C // self.heads) ** 0.5
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.attn.c_proj(y)

    def forward(self, x):
        x = x + self.attention(self.ln_1(x))
        h = nn.functional.gelu(self.mlp.c_fc(self.ln_2(x)), approximate="tanh")
        return x + self.mlp.c_proj(h)


class TinyGPT(nn.Module):
    def __init__(self, vocab, block, layers, heads, width):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, width), wpe=nn.Embedding(block, width),
            h=nn.ModuleList([Block(width, heads, block) for _ in range(layers)]),
            ln_f=nn.LayerNorm(width)))
        self.lm_head = nn.Linear(width, vocab, bias=False)
        self.lm_head.weight = self.transformer.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / (2 * layers) ** 0.5)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" not in name:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx):
        t = self.transformer
        x = t.wte(idx) + t.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in t.h:
            x = b(x)
        return self.lm_head(t.ln_f(x))


def get_lr(it, max_lr=1e-3, min_lr=1e-4, warmup=2, decay=3):
    if it < warmup:
        return max_lr * (it + 1) / (warmup + 1)
    if it > decay:
        return min_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay - warmup)))
    return min_lr + coeff * (max_lr - min_lr)


def optimizer(model, lr, betas, weight_decay, eps=1e-8):
    """AdamW with weight decay on parameters of 2 or more dimensions only (GPT-2's groups)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=betas, eps=eps)
