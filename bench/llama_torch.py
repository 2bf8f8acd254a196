"""llama_torch.py: transformers' LlamaForCausalLM trained as gpt_train --arch llama trains one,
for bench/llama_vs_torch.py: the same shape, AdamW (weight decay on the matrices), gradients
clipped at 1.0, random windows of Debian's fortunes as bytes. Ends with one JSON line: tokens per
second over the iterations after 3 of warm-up (the median iteration's), and the last loss.

Usage: llama_torch.py [--threads N] [--iters N] [--batch_size N] [--block N] [--n_layer N]
                      [--n_embd N] [--n_head N] [--n_kv_head N] [--intermediate N]
Run with .pyenv/bin/python (transformers; Debian's PyTorch).
"""
import argparse
import glob
import json
import statistics
import time

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

p = argparse.ArgumentParser()
for name, default in (("threads", 1), ("iters", 20), ("batch_size", 8), ("block", 128),
                      ("n_layer", 4), ("n_embd", 256), ("n_head", 8), ("n_kv_head", 4),
                      ("intermediate", 704)):
    p.add_argument("--" + name, type=int, default=default)
a = p.parse_args()
torch.set_num_threads(a.threads)
torch.manual_seed(1337)
text = b"".join(open(f, "rb").read() for f in sorted(glob.glob("/usr/share/games/fortunes/*"))
                if not f.endswith((".dat", ".u8")))
data = torch.from_numpy(np.frombuffer(text, dtype=np.uint8).astype(np.int64))
cfg = LlamaConfig(vocab_size=256, hidden_size=a.n_embd, intermediate_size=a.intermediate,
                  num_hidden_layers=a.n_layer, num_attention_heads=a.n_head,
                  num_key_value_heads=a.n_kv_head, max_position_embeddings=a.block,
                  tie_word_embeddings=False, attn_implementation="eager")
m = LlamaForCausalLM(cfg).train()
decay = [q for q in m.parameters() if q.dim() >= 2]
no_decay = [q for q in m.parameters() if q.dim() < 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                         {"params": no_decay, "weight_decay": 0.0}], lr=1e-3, betas=(0.9, 0.99))
times, loss = [], None
for it in range(a.iters + 3):
    ix = torch.randint(len(data) - a.block - 1, (a.batch_size,))
    x = torch.stack([data[i:i + a.block] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + a.block] for i in ix])
    t0 = time.perf_counter()
    logits = m(x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    loss = loss.item()
    if it >= 3:
        times.append(time.perf_counter() - t0)
med = statistics.median(times)
print(json.dumps({"tokens_per_s": a.batch_size * a.block / med, "median_iter_ms": med * 1e3,
                  "last_loss": loss, "threads": a.threads,
                  "params": sum(q.numel() for q in m.parameters())}))
