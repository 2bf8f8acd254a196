"""What cddp exports (model_check.c: cddp_model_save_hf and cddp_llama_config_write), opened by
transformers' LlamaForCausalLM.from_pretrained: the logits of make_model.py's batch as
transformers computed them before (export_gqa, untied; export_mqa, tied with Llama 3's
rope_scaling), and the bfloat16 export holding the float32 weights as PyTorch rounds them.

Usage: check_export.py OUTDIR (make_model.py's, after model_check)
"""
import os
import sys

import torch
from transformers import LlamaForCausalLM

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import safetensors_np  # noqa: E402

out = sys.argv[1]
for case in ("gqa", "mqa"):
    ref, _ = safetensors_np.load(os.path.join(out, case, "reference.safetensors"))
    m = LlamaForCausalLM.from_pretrained(os.path.join(out, "export_" + case)).eval()
    with torch.no_grad():
        got = m(torch.from_numpy(ref["x"].copy())).logits.numpy()
    diff = abs(got - ref["logits"]).max() / abs(ref["logits"]).max()
    assert diff <= 1e-5, (case, diff)
    print(f"ok: export_{case} loads in transformers, its logits within {diff:.1e} relative")
f32 = LlamaForCausalLM.from_pretrained(os.path.join(out, "export_gqa")).state_dict()
bf16 = LlamaForCausalLM.from_pretrained(os.path.join(out, "export_bf16"),
                                        torch_dtype=torch.bfloat16).state_dict()
for k, v in f32.items():
    assert bf16[k].dtype == torch.bfloat16 and torch.equal(bf16[k], v.to(torch.bfloat16)), k
print("ok: cddp's exports load in transformers as it saved them")
