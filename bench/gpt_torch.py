#!/usr/bin/python3
"""gpt_torch.py: PyTorch's side of the GPT comparisons: the same model, data and recipe as
examples/gpt_train.c, so that speed (bench/gpt_vs_torch.sh) and the loss reached
(tests/gpt/learn_reference.json) can be set side by side.

The model is nanoGPT's (tests/reference/nanogpt.py). The text is read as cddp reads it with the
byte tokenizer: a file, or a folder's regular text files in name order (no symbolic links, no
file holding a NUL byte), split 90/10. Training windows start at every offset (stride 1) and are
drawn without replacement in a seeded random order, each rank taking every world-th of it (what
cddp's DistributedSampler does, with another generator); the validation loss is the mean over
every token of the non-overlapping validation windows. Each iteration: nanoGPT's learning rate,
zero_grad, forward, cross-entropy, backward, clip_grad_norm_, AdamW step. The clock runs around
the iterations only. --dtype bf16 runs the forward and the loss under CPU autocast to bfloat16
(PyTorch's mixed precision on the CPU); --device cuda trains on the GPU (CUDA autocast for bf16),
each iteration timed after torch.cuda.synchronize(); --compile trains torch.compile(model); --data
DIR/x_train.bin reads llm.c's token files (x_train.bin and x_val.bin, --vocab_size by default the
largest token + 1). With WORLD_SIZE > 1 (RANK, MASTER_ADDR, MASTER_PORT set by cddprun) the model
is wrapped with DistributedDataParallel over gloo. Rank 0 prints one JSON line.
"""
import argparse
import json
import os
import resource
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
from nanogpt import TinyGPT, get_lr, optimizer  # noqa: E402


def read_text(path):
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            return f.read()
    parts = []
    for name in sorted(os.listdir(path)):
        p = os.path.join(path, name)
        if name.startswith(".") or os.path.islink(p) or not os.path.isfile(p):
            continue
        with open(p, "rb") as f:
            b = f.read()
        if b"\0" not in b:
            parts.append(b)
    return b"".join(parts)


def read_tokens(path):
    """An llm.c token file (a header of 256 int32: magic 20240520, version 1, the count; then the
    tokens as uint16), as int64."""
    head = np.fromfile(path, dtype="<i4", count=256)
    if head[0] != 20240520 or head[1] != 1:
        sys.exit(f"gpt_torch.py: {path}: not an llm.c token file")
    toks = np.fromfile(path, dtype="<u2", offset=256 * 4)
    if len(toks) != head[2]:
        sys.exit(f"gpt_torch.py: {path}: {len(toks)} tokens, the header says {head[2]}")
    return toks.astype(np.int64)


def main():
    p = argparse.ArgumentParser()
    for name, default in [("n_layer", 4), ("n_head", 4), ("n_embd", 128), ("block_size", 64),
                          ("batch_size", 12), ("max_iters", 2000), ("warmup_iters", 100),
                          ("lr_decay_iters", -1), ("threads", 1), ("seed", 1337),
                          ("eval_batches", 0), ("vocab_size", 0)]:
        p.add_argument("--" + name, type=int, default=default)
    for name, default in [("lr", 1e-3), ("min_lr", 1e-4), ("weight_decay", 0.1),
                          ("grad_clip", 1.0), ("beta1", 0.9), ("beta2", 0.99)]:
        p.add_argument("--" + name, type=float, default=default)
    p.add_argument("--data", default="/usr/share/games/fortunes")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward and the loss under torch.autocast('cpu', bfloat16)")
    p.add_argument("--device", default="cpu",
                   help="cpu, or cuda: the model and batches on the GPU (bf16: CUDA autocast), "
                   "the clock read after torch.cuda.synchronize()")
    p.add_argument("--compile", action="store_true",
                   help="train torch.compile(model) (the first iterations compile)")
    p.add_argument("--zero", action="store_true",
                   help="ZeroRedundancyOptimizer: AdamW's state sharded across the ranks")
    a = p.parse_args()
    if a.lr_decay_iters < 0:
        a.lr_decay_iters = a.max_iters
    torch.set_num_threads(a.threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))

    if a.data.endswith("train.bin"):  # llm.c's token files: this one and its val.bin
        tr = read_tokens(a.data)
        va = read_tokens(a.data[:-len("train.bin")] + "val.bin")
        train, val = torch.from_numpy(tr), torch.from_numpy(va)
        vocab = a.vocab_size or max(256, int(max(tr.max(), va.max())) + 1)
    else:
        text = np.frombuffer(read_text(a.data), dtype=np.uint8).astype(np.int64)
        n_train = int(len(text) * (1 - 0.1))
        train, val = torch.from_numpy(text[:n_train]), torch.from_numpy(text[n_train:])
        vocab = a.vocab_size or 256
    T, B = a.block_size, a.batch_size
    n_windows = len(train) - T

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model = TinyGPT(vocab=vocab, block=T, layers=a.n_layer, heads=a.n_head, width=a.n_embd).to(dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    params = sum(p.numel() for p in model.parameters())
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    if a.zero and world > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        opt = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW, lr=a.lr,
                                      betas=(a.beta1, a.beta2), eps=1e-8,
                                      weight_decay=a.weight_decay)
        opt.add_param_group({"params": no_decay, "weight_decay": 0.0})
    else:
        opt = optimizer(model, a.lr, (a.beta1, a.beta2), a.weight_decay)
    step_model = torch.compile(model) if a.compile else model
    gen = torch.Generator().manual_seed(a.seed)
    order = torch.randperm(n_windows, generator=gen)[rank::world]
    offsets = torch.arange(T + 1)
    train_s, it_time = 0.0, []
    for it in range(a.max_iters):
        t0 = time.perf_counter()
        lr = get_lr(it, a.lr, a.min_lr, a.warmup_iters, a.lr_decay_iters)
        for g in opt.param_groups:
            g["lr"] = lr
        starts = order[it * B:(it + 1) * B]
        w = train[starts[:, None] + offsets].to(dev)
        x, y = w[:, :-1], w[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            logits = step_model(x)
            loss = nn.functional.cross_entropy(logits.view(-1, vocab), y.reshape(-1))
        loss.backward()
        if a.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), a.grad_clip)
        opt.step()
        sync()
        dt = time.perf_counter() - t0
        train_s += dt
        it_time.append(dt)

    # The validation loss over every non-overlapping window, shared by the ranks.
    core = model.module if world > 1 else model
    nv = (len(val) - T - 1) // T + 1
    total = torch.zeros(2, dtype=torch.float64, device=dev)
    with torch.no_grad():
        mine = list(range(rank, nv, world))
        if a.eval_batches:
            mine = mine[:a.eval_batches * B]
        for i in range(0, len(mine), B):
            starts = torch.tensor(mine[i:i + B]) * T
            w = val[starts[:, None] + offsets].to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                logits = core(w[:, :-1]).float()
            total[0] += nn.functional.cross_entropy(logits.reshape(-1, vocab), w[:, 1:].reshape(-1),
                                                    reduction="sum").double()
            total[1] += w[:, 1:].numel()
    if world > 1:
        dist.all_reduce(total)
    tokens = a.max_iters * B * T * world
    local = opt.optim if hasattr(opt, "optim") else opt  # ZeRO's local optimizer
    state_bytes = sum(t.numel() * t.element_size() for st in local.state.values()
                      for k, t in st.items() if k in ("exp_avg", "exp_avg_sq"))
    if rank == 0:
        print(json.dumps({"impl": "pytorch", "zero": bool(a.zero and world > 1),
                          "optim_state_bytes": state_bytes,
                          "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                          * 1024, "torch": torch.__version__, "world": world,
                          "threads": a.threads, "iters": a.max_iters, "params": params,
                          "dtype": a.dtype, "compile": a.compile, "device": a.device,
                          "train_s": round(train_s, 3),
                          "tokens_per_s": round(tokens / train_s, 1) if train_s else 0,
                          "median_iter_ms": round(1e3 * float(np.median(it_time)), 3)
                          if it_time else 0,
                          "last_loss": round(loss.item(), 4) if a.max_iters else None,
                          "val_loss": round((total[0] / total[1]).item(), 4)}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
