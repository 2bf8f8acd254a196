#!/usr/bin/python3
"""mlp_torch.py: PyTorch's side of bench/mlp_vs_torch.sh, bench/ddp_vs_torch.sh and
bench/cnn_vs_torch.sh, in the setting of bench_mlp.c.

--model mlp (784-512-512-10, the default) or cnn (fashion_mnist's: conv 1->16 3x3, ReLU, pool 2,
conv 16->32 3x3, ReLU, pool 2, fc 1568->128, ReLU, fc 128->10) or resnet (fashion_mnist's: the
ResNet of tests/reference/resnet.py at 16, 32, 64 channels), one epoch of Fashion-MNIST at batch 32 per rank, SGD lr 0.01, one thread
per rank: the training set normalised once up front, a seeded shuffle (each rank its
DistributedSampler part), and the clock around the training loop only (batch gathering included).
With WORLD_SIZE > 1 (RANK, MASTER_ADDR, MASTER_PORT set, as cddprun or torchrun do) the model is
wrapped with DistributedDataParallel over gloo. --device cuda trains on the GPU (each batch copied
there from the host, as bench_mlp does; the clock read after the GPU is done); --dtype bf16 runs
the forward and the loss under autocast to bfloat16. Rank 0 prints one
JSON line.
"""
import argparse
import gzip
import json
import os
import time

import sys

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "reference"))
from resnet import ResNet  # noqa: E402


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def models():
    return {
        "mlp": lambda: nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512),
                                     nn.ReLU(), nn.Linear(512, 10)),
        "cnn": lambda: nn.Sequential(nn.Conv2d(1, 16, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Conv2d(16, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2),
                                     nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                                     nn.Linear(128, 10)),
        "resnet": lambda: ResNet(1, (16, 32, 64), 1, 10),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--model", choices=["mlp", "cnn", "resnet"], default="mlp")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the forward and the loss under CPU autocast to bfloat16")
    p.add_argument("--limit", type=int, default=0,
                   help="train on the first N samples only (default: all)")
    p.add_argument("--data", default=os.environ.get("CDDP_DATA",
                                                    "/usr/share/datasets/fashion-mnist"))
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    x = torch.tensor(idx(os.path.join(a.data, "train-images-idx3-ubyte.gz")), dtype=torch.float32)
    x = ((x / 255.0 - 0.1307) / 0.3081).reshape((-1, 784) if a.model == "mlp" else (-1, 1, 28, 28))
    y = torch.tensor(idx(os.path.join(a.data, "train-labels-idx1-ubyte.gz")), dtype=torch.int64)
    dev = torch.device(a.device)
    model = models()[a.model]().to(dev)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    loss_fn = nn.CrossEntropyLoss()
    if a.limit > 0:
        x, y = x[:a.limit], y[:a.limit]
    n, samples, train_s = x.shape[0], 0, 0.0
    for _ in range(a.epochs):
        order = torch.randperm(n)[rank::world]  # what DistributedSampler gives this rank
        t0 = time.perf_counter()
        for first in range(0, order.shape[0], a.batch_size):
            idx_b = order[first:first + a.batch_size]
            xb, yb = x[idx_b].to(dev), y[idx_b].to(dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
                loss = loss_fn(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            samples += xb.shape[0]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        train_s += time.perf_counter() - t0
    if world > 1:  # every rank's samples over the slowest rank's time
        t = torch.tensor([float(samples), train_s], dtype=torch.float64)
        dist.all_reduce(t[:1])
        dist.all_reduce(t[1:], op=dist.ReduceOp.MAX)
        samples, train_s = int(t[0].item()), t[1].item()
        dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"impl": "pytorch", "version": torch.__version__, "device": a.device,
                          "dtype": a.dtype,
                          "model": a.model,
                          "world": world,
                          "batch": a.batch_size, "threads": a.threads, "samples": samples,
                          "train_s": round(train_s, 3),
                          "samples_per_s": round(samples / train_s, 1),
                          "final_loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
