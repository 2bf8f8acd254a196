#!/bin/sh
# train_test.sh BUILD_DIR PYTHON: gpt_train --arch llama, as a user trains and fine-tunes a Llama,
# with transformers (PYTHON: .pyenv's) as the reference.
#
#   1. A Llama with grouped-query attention (4 heads, 2 key/value heads) trains from scratch on 2
#      ranks under cddprun: the loss falls; one rank with 2 accumulation steps gives its losses at
#      every iteration; 10 iterations and a --resume to 20 (the arch read from the checkpoint)
#      give the uninterrupted run's loss at every iteration.
#   2. Fine-tuning from Hugging Face's LlamaForCausalLM (make_model.py's, its folder): the whole
#      validation text's loss at step 0 is the one transformers computes on the same windows.
#   3. The fine-tuned checkpoint exported (cddp-ckpt export-hf) loads in transformers, whose
#      greedy generate(do_sample=False) draws gpt_generate's tokens, token for token.
set -u
build=$1 py=$2
src=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CDDP_LOG_LEVEL=error
fail() { echo "FAIL: $*"; exit 1; }
B=$build/bin

"$py" "$src/make_model.py" hf > make.out 2>&1 || { cat make.out; fail "make_model.py failed"; }
"$py" - <<'PYEOF' || fail "cannot write the token files"
import glob
import numpy as np
text = b"".join(open(f, "rb").read() for f in sorted(glob.glob("/usr/share/games/fortunes/[a-f]*"))
                if not f.endswith((".dat", ".u8")))
ids = np.frombuffer(text, dtype=np.uint8).astype(np.uint16) % 64  # the reference's vocabulary
for name, part in (("train", ids[:60000]), ("val", ids[60000:64000])):
    header = np.zeros(256, np.int32)
    header[:4] = [20240520, 1, len(part), 64]  # llm.c's format, cddp's vocabulary recorded
    open(f"{name}.bin", "wb").write(header.tobytes() + part.tobytes())
PYEOF

# 1. from scratch, data-parallel, and a resume
L="--n_layer 2 --n_head 4 --n_embd 32 --block_size 16 --batch_size 4 --data train.bin --eval_interval 10
   --eval_iters 1 --final_eval 1 --log_interval 1 --sample 0 --warmup_iters 2 --lr 1e-2 --lr_decay_iters 20"
"$B/cddprun" --standalone --nproc_per_node 2 "$B/gpt_train" --arch llama --n_kv_head 2 $L --max_iters 20 \
    --out full > full.out 2>&1 || { cat full.out; fail "2 ranks of a Llama did not train"; }
"$B/cddprun" --standalone --nproc_per_node 2 "$B/gpt_train" --arch llama --n_kv_head 2 $L --max_iters 10 \
    --out half > half.out 2>&1 || { cat half.out; fail "the first half did not train"; }
"$B/cddprun" --standalone --nproc_per_node 2 "$B/gpt_train" $L --max_iters 20 --out half --resume \
    > rest.out 2>&1 || { cat rest.out; fail "the resume failed"; }
first=$(sed -n 's/^iter 0: loss \([0-9.]*\).*/\1/p' full.out)
last=$(sed -n 's/^iter 19: loss \([0-9.]*\).*/\1/p' full.out)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 4 && b < a - 0.3) }' ||
    fail "the loss went from $first to $last in 20 iterations"
"$B/gpt_train" --arch llama --n_kv_head 2 $L --max_iters 20 --grad_accum 2 --out accum > accum.out 2>&1 ||
    { cat accum.out; fail "one rank with 2 accumulation steps did not train"; }
awk -F, 'NR == FNR { if (FNR > 1) want[$1] = $3; next }
         FNR > 1 { n++; d = $3 - want[$1]; if (d < 0) d = -d
                   if (!($1 in want) || d > 1e-5 * want[$1] + 1e-5) { print "step " $1 ": " $3 " vs " want[$1]; bad = 1 } }
         END { if (n != 20) { print n " steps"; bad = 1 }; exit bad }' full/loss.csv accum/loss.csv ||
    fail "one rank with 2 accumulation steps does not give the 2 ranks' losses"
for i in $(seq 10 19); do
    a=$(grep "^iter $i:" full.out | cut -d, -f1) b=$(grep "^iter $i:" rest.out | cut -d, -f1)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "iteration $i: '$a' uninterrupted, '$b' resumed"
done

# 2. fine-tuning from Hugging Face's Llama: its loss at step 0 (the whole validation text)
"$B/gpt_train" --init_from hf/gqa --data train.bin --block_size 16 --max_iters 0 --final_eval 0 \
    --sample 0 --out none > step0.out 2>&1 || { cat step0.out; fail "evaluating Hugging Face's Llama failed"; }
step0=$(sed -n 's/^step 0: .*val loss \([0-9.]*\) (the whole validation text).*/\1/p' step0.out)
"$B/gpt_train" --init_from hf/gqa --data train.bin --block_size 16 --max_iters 5 --eval_interval 5 \
    --eval_iters 1 --final_eval 1 --log_interval 1 --sample 0 --out tuned > tuned.out 2>&1 ||
    { cat tuned.out; fail "fine-tuning from Hugging Face's Llama failed"; }
"$py" - "$step0" <<'PYEOF' || fail "the step-0 validation loss is not transformers'"
import sys
import numpy as np
import torch
from transformers import LlamaForCausalLM
m = LlamaForCausalLM.from_pretrained("hf/gqa").eval()
val = np.frombuffer(open("val.bin", "rb").read()[1024:], dtype=np.uint16).astype(np.int64)
n = (len(val) - 17) // 16 + 1  # gpt_train's windows of 16, every 16 tokens
x = torch.tensor(np.stack([val[i * 16:i * 16 + 16] for i in range(n)]))
y = torch.tensor(np.stack([val[i * 16 + 1:i * 16 + 17] for i in range(n)]))
with torch.no_grad():
    loss = torch.nn.functional.cross_entropy(m(x).logits.reshape(-1, 64), y.reshape(-1)).item()
got = float(sys.argv[1])
assert abs(got - loss) <= 1e-4, (got, loss)  # gpt_train prints 4 decimals
print(f"ok: step-0 validation loss {got}, transformers' {loss:.6f}")
PYEOF

# 3. back to transformers
"$B/cddp-ckpt" export-hf tuned/checkpoint.safetensors tuned_hf > export.out 2>&1 ||
    { cat export.out; fail "export-hf of the Llama failed"; }
cddp=$("$B/gpt_generate" tuned/checkpoint.safetensors --temperature 0 --tokens 12 --prompt_ids 1,2,3 2> /dev/null |
    od -An -tu1 | tr -s ' \n' ' ') || fail "gpt_generate of the Llama failed"
"$py" - "$cddp" <<'PYEOF' || fail "transformers does not generate from the export what cddp does"
import sys
import torch
from transformers import LlamaForCausalLM
want = [int(t) for t in sys.argv[1].split()][:15]  # the prompt, 12 tokens (then a newline)
m = LlamaForCausalLM.from_pretrained("tuned_hf").eval()
m.generation_config.eos_token_id = None
with torch.no_grad():
    got = m.generate(torch.tensor([[1, 2, 3]]), do_sample=False, max_new_tokens=12,
                     min_new_tokens=12, attention_mask=torch.ones(1, 3, dtype=torch.long),
                     pad_token_id=0)[0].tolist()
assert got == want, (got, want)
print(f"ok: transformers draws cddp's 12 greedy tokens from the export")
PYEOF
echo "ok: a Llama trained, resumed, fine-tuned from Hugging Face's and back"
