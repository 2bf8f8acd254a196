#!/usr/bin/python3
"""ckpt_val_loss.py CHECKPOINT VAL_BIN HEADS: a GPT checkpoint gpt_train wrote (on any device),
loaded into PyTorch's nanoGPT model of its shape with load_state_dict(strict=True) (the tied
lm_head.weight included; the optimizer's state left out), and its validation loss as gpt_train's
last evaluation takes it: the mean cross-entropy over every token of the non-overlapping windows
of block_size tokens of VAL_BIN (llm.c's token format: a 1024-byte header, then uint16 tokens),
on the CPU in float64. Prints the loss."""
import os
import sys

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import safetensors_np  # noqa: E402
from nanogpt import TinyGPT  # noqa: E402


def main():
    if len(sys.argv) != 4:
        sys.exit("usage: ckpt_val_loss.py CHECKPOINT VAL_BIN HEADS")
    ckpt, _ = safetensors_np.load(sys.argv[1])
    state = {k: torch.from_numpy(np.array(v)) for k, v in ckpt.items() if not k.startswith("optim.")}
    vocab, width = state["transformer.wte.weight"].shape
    block = state["transformer.wpe.weight"].shape[0]
    layers = len({k.split(".")[2] for k in state if k.startswith("transformer.h.")})
    model = TinyGPT(vocab, block, layers, int(sys.argv[3]), width)
    model.load_state_dict(state, strict=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    model = model.double().eval()
    raw = open(sys.argv[2], "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    assert header[0] == 20240520, f"{sys.argv[2]}: not an llm.c token file"
    tokens = np.frombuffer(raw[1024:], dtype="<u2")[:header[2]].astype(np.int64)
    windows = (len(tokens) - block - 1) // block + 1
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, windows, 64):
            w = range(i, min(i + 64, windows))
            x = torch.tensor(np.stack([tokens[j * block:j * block + block] for j in w]))
            y = torch.tensor(np.stack([tokens[j * block + 1:j * block + block + 1] for j in w]))
            logits = model(x)
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, vocab), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    print(f"{total / count:.6f}")


if __name__ == "__main__":
    main()
