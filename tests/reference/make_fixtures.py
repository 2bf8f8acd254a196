#!/usr/bin/python3
"""make_fixtures.py: reference values from PyTorch for tests/test_reference.c.

Run with Debian's python3-torch (apt-get install python3-torch), from the repository root:
    /usr/bin/python3 tests/reference/make_fixtures.py
It rewrites tests/reference/{mlp,cnn,resnet,gpt}.safetensors. The test itself needs no Python.

For each model (the seed's MLP layer structure at width 128, a small CNN with two convolutions,
two poolings and two linear layers, and a ResNet of two stages (16 and 32 channels: whole blocks
of oneDNN's channel-blocked layout, which cddp's ResNet keeps between layers) of one basic block
each, with BatchNorm in training mode, as cddp_nn_resnet builds it) the file holds, under these names:
  init.<param>         PyTorch's default initialisation (seed 0), float32
  x.<i>, y.<i>         three batches of 8 inputs and int64 labels
  grad.<param>         the gradient of mean cross-entropy on batch 0 at init
  loss.grad            that loss (shape [1])
  sgd.<param>          parameters after 3 SGD steps (lr 0.01, momentum 0.9) on batches 0, 1, 2
  loss.sgd             the 3 losses seen by those steps
  adamw.<param>        parameters after 3 AdamW steps (lr 1e-3, eps 1e-5, other defaults)
  loss.adamw           the 3 losses
Every value is computed in float64 from the float32 inputs, then stored as float32, so the test
compares cddp's float32 arithmetic with the exact result rather than with another rounding.

AdamW uses eps = 1e-5 instead of the default 1e-8: Adam divides each gradient by its own running
magnitude, so an element whose gradient is at float32 rounding level (about 1e-9 here) takes a
full +-lr step whose sign is noise, in any float32 implementation. With eps = 1e-8, PyTorch's own
float32 run lands 8e-6 (relative to the tensor's largest value) from the float64 result on the
MLP's first layer; eps = 1e-5 keeps those elements' steps small, so the comparison measures the
update rule and not the noise. test_optim.c checks the default-eps rule on hand-derived values.
"""
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_np  # noqa: E402
from nanogpt import TinyGPT, get_lr, optimizer  # noqa: E402
from resnet import ResNet  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def cnn():
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(8 * 7 * 7, 32), nn.ReLU(), nn.Linear(32, 10))


def run(make, shape, path):
    torch.manual_seed(0)
    model = make()
    init = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randn((8,) + shape, generator=gen) for _ in range(3)]
    ys = [torch.randint(0, 10, (8,), generator=gen) for _ in range(3)]
    out = {f"init.{k}": v.numpy() for k, v in init.items()}
    for i in range(3):
        out[f"x.{i}"] = xs[i].numpy()
        out[f"y.{i}"] = ys[i].numpy().astype(np.int64)

    def fresh():
        m = make().double()
        m.load_state_dict({k: v.double() for k, v in init.items()})
        return m

    m = fresh()
    loss = nn.functional.cross_entropy(m(xs[0].double()), ys[0])
    loss.backward()
    out["loss.grad"] = np.array([loss.item()], dtype=np.float32)
    for k, p in m.named_parameters():
        out[f"grad.{k}"] = p.grad.float().numpy()

    for name, make_opt in (("sgd", lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9)),
                           ("adamw", lambda ps: torch.optim.AdamW(ps, lr=1e-3, eps=1e-5))):
        m = fresh()
        opt = make_opt(m.parameters())
        losses = []
        for i in range(3):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(m(xs[i].double()), ys[i])
            loss.backward()
            opt.step()
            losses.append(loss.item())
        out[f"loss.{name}"] = np.array(losses, dtype=np.float32)
        for k, p in m.named_parameters():
            out[f"{name}.{k}"] = p.detach().float().numpy()
    safetensors_np.save(path, out, {"generator": "tests/reference/make_fixtures.py",
                                    "torch": torch.__version__})
    print(f"wrote {path}")


# ---- a tiny GPT, as nanoGPT writes it ------------------------------------------------------
#
# gpt.safetensors: a GPT of 2 layers, 2 heads, width 32, context 16, vocabulary 256, pre-LN
# blocks with GELU-tanh MLPs and the language-model head tied to the token embedding, GPT-2's
# initialisation (seed 0). It holds init.<param> (named_parameters: the tied head once, as
# transformer.wte.weight), three batches x.<i>, y.<i> (4 sequences of 16 tokens, int64),
# loss.grad and grad.<param> (mean cross-entropy over every position of batch 0), and the result
# of 3 steps of GPT-2's recipe (adamw.<param>, loss.adamw): AdamW (betas 0.9, 0.95, eps 1e-5,
# weight decay 0.1 on parameters of 2 or more dimensions only), the gradients' global norm
# clipped at 1.0, the learning rate warmed up over 2 steps to 1e-3 then cosine-decayed to 1e-4
# at step 3 (nanoGPT's get_lr), computed in float64.

GPT = dict(vocab=256, block=16, layers=2, heads=2, width=32)


def run_gpt(path):
    torch.manual_seed(0)
    model = TinyGPT(**GPT)
    init = {k: p.detach().float().clone() for k, p in model.named_parameters()}
    gen = torch.Generator().manual_seed(1)
    xs = [torch.randint(0, GPT["vocab"], (4, GPT["block"]), generator=gen) for _ in range(3)]
    ys = [torch.randint(0, GPT["vocab"], (4, GPT["block"]), generator=gen) for _ in range(3)]
    out = {f"init.{k}": v.numpy() for k, v in init.items()}
    for i in range(3):
        out[f"x.{i}"] = xs[i].numpy().astype(np.int64)
        out[f"y.{i}"] = ys[i].numpy().astype(np.int64)

    def fresh():
        m = TinyGPT(**GPT).double()
        with torch.no_grad():
            for k, p in m.named_parameters():
                p.copy_(init[k].double())
        return m

    def loss_of(m, i):
        logits = m(xs[i])
        return nn.functional.cross_entropy(logits.view(-1, GPT["vocab"]), ys[i].view(-1))

    m = fresh()
    loss = loss_of(m, 0)
    loss.backward()
    out["loss.grad"] = np.array([loss.item()], dtype=np.float32)
    for k, p in m.named_parameters():
        out[f"grad.{k}"] = p.grad.float().numpy()

    m = fresh()
    opt = optimizer(m, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-5)
    losses = []
    for i in range(3):
        for g in opt.param_groups:
            g["lr"] = get_lr(i)
        opt.zero_grad()
        loss = loss_of(m, i)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    out["loss.adamw"] = np.array(losses, dtype=np.float32)
    for k, p in m.named_parameters():
        out[f"adamw.{k}"] = p.detach().float().numpy()
    safetensors_np.save(path, out, {"generator": "tests/reference/make_fixtures.py",
                                    "torch": torch.__version__})
    print(f"wrote {path}")


if __name__ == "__main__":
    run(mlp, (784,), os.path.join(HERE, "mlp.safetensors"))
    run(cnn, (1, 28, 28), os.path.join(HERE, "cnn.safetensors"))
    run(lambda: ResNet(widths=(16, 32)), (1, 12, 12), os.path.join(HERE, "resnet.safetensors"))
    run_gpt(os.path.join(HERE, "gpt.safetensors"))
