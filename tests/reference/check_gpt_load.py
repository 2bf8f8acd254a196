#!/usr/bin/python3
"""check_gpt_load.py DIR [FILE]: a GPT checkpoint cddp wrote loads into PyTorch's GPT of the same
shape with load_state_dict(strict=True) (the tied lm_head.weight included), and PyTorch's logits
on the same batch equal cddp's within 1e-5 relative. DIR comes from `test_reference --write-gpt
DIR`. FILE (in DIR): the checkpoint as `cddp-ckpt consolidate` wrote it, which must hold the
model's tensors alone (no optimizer state) and load as it is."""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_np  # noqa: E402
from make_fixtures import GPT  # noqa: E402
from nanogpt import TinyGPT  # noqa: E402

consolidated = len(sys.argv) > 2
ckpt, meta = safetensors_np.load(os.path.join(sys.argv[1], sys.argv[2] if consolidated
                                              else "gpt_checkpoint.safetensors"))
model_keys = {k: v for k, v in ckpt.items() if not k.startswith("optim.")}
assert not consolidated or model_keys.keys() == ckpt.keys(), "optimizer state left in the file"
assert "lm_head.weight" in model_keys, sorted(model_keys)
assert np.array_equal(model_keys["lm_head.weight"], model_keys["transformer.wte.weight"])
model = TinyGPT(**GPT)
model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in model_keys.items()},
                      strict=True)
assert model.lm_head.weight is model.transformer.wte.weight
fixture, _ = safetensors_np.load(os.path.join(HERE, "gpt.safetensors"))
with torch.no_grad():
    logits = model(torch.from_numpy(np.array(fixture["x.1"]))).numpy()
want, _ = safetensors_np.load(os.path.join(sys.argv[1], "gpt_logits.safetensors"))
diff = np.abs(logits - want["logits"]).max()
scale = np.abs(want["logits"]).max()
assert diff <= 1e-5 * scale, f"logits differ by {diff} (scale {scale})"
print(f"ok: PyTorch loaded cddp's GPT {'consolidated ' if consolidated else ''}checkpoint strictly ({len(model_keys)} tensors); "
      f"logits agree within {diff / scale:.1e} relative")
