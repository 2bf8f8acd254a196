#!/bin/sh
# journey_test.sh BUILD_DIR PYTHON: a tokenizer from text to training to generation, as a user
# goes, with PyPI's tokenizers (PYTHON: .pyenv's) as the reference.
#
#   1. A GPT-2-style tokenizer.json (tokenizers trains it on the fortunes) and cddp-tokenize
#      --tokenizer: train.bin + val.bin hold exactly tokenizers' ids of each file, each after
#      <|endoftext|>, llm.c's uint16 format with the vocabulary recorded; an added token past
#      65,535 makes the files llm.c's uint32 ones (magic 20240801, version 7).
#   2. gpt_train on 2 ranks under cddprun takes its vocabulary from the files and prints the
#      --prompt's sample as text through --tokenizer.
#   3. What a user gets wrong is refused before any training, naming both sides: byte-tokenized
#      data for a model of the tokenizer's vocabulary (--init_from), the model's data with a
#      byte model, a --prompt without a tokenizer for a model of more than 256 tokens.
#   4. gpt_generate from nothing starts at the tokenizer's start token (<|endoftext|>): the same
#      greedy text as --prompt_ids of that token; --prompt through the tokenizer equals
#      --prompt_ids of tokenizers' ids for it.
#   5. cddp-ckpt export-hf: transformers' GPT2LMHeadModel.from_pretrained loads the model (f32)
#      and generates cddp's greedy ids token for token; its AutoTokenizer (the files copied beside)
#      gives tokenizers' ids; the bf16 and f16 exports hold the f32 weights as PyTorch rounds them;
#      what transformers saves back (save_pretrained), cddp loads and generates the same ids.
set -u
build=$1 py=$2
work=${KEEP_WORK:-$(mktemp -d)}
[ -n "${KEEP_WORK:-}" ] || trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 CDDP_LOG_LEVEL=error
fail() { echo "FAIL: $*"; exit 1; }
B=$build/bin

mkdir text && for f in cookie linux wisdom; do cp "/usr/share/games/fortunes/$f" text/; done
"$py" - <<'PYEOF' || fail "tokenizers could not train the tokenizer"
import glob, json
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(sorted(glob.glob("text/*")), trainers.BpeTrainer(
    vocab_size=1000, special_tokens=["<|endoftext|>"], show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tok.save("tok.json")
d = json.load(open("tok.json"))  # the same, with a vocabulary to 70000 and an added token there
d["model"]["vocab"].update({f"unused{k}": k for k in range(1000, 70000)})
d["added_tokens"].append({"id": 70000, "content": "<|big|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True})
json.dump(d, open("wide.json", "w"))
PYEOF

# 1. the token files
"$B/cddp-tokenize" --tokenizer tok.json text data > tok.out 2>&1 || { cat tok.out; fail "cddp-tokenize --tokenizer failed"; }
grep -q "(vocabulary 1000)" tok.out || { cat tok.out; fail "cddp-tokenize does not say the vocabulary"; }
printf 'Hello <|big|> world<|big|>\n' > text/zz_big
"$B/cddp-tokenize" --tokenizer wide.json --val_fraction 0.5 text/zz_big wide > wide.out 2>&1 || { cat wide.out; fail "a vocabulary past 65,535 was not written"; }
rm text/zz_big
"$py" - <<'PYEOF' || fail "the token files do not hold tokenizers' ids"
import glob
import numpy as np
from tokenizers import Tokenizer
def load(path, magic=20240520, version=1, dtype=np.uint16):  # as llm.c's loader reads them
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        tokens = np.frombuffer(f.read(), dtype=dtype)
    assert (header[0], header[1]) == (magic, version), header[:4]
    assert header[2] == len(tokens), (header[2], len(tokens))
    return header[3], tokens
tok = Tokenizer.from_file("tok.json")
eot = tok.token_to_id("<|endoftext|>")
want = []
for f in sorted(glob.glob("text/*")):
    want += [eot] + tok.encode(open(f, encoding="utf-8", errors="replace").read(),
                               add_special_tokens=False).ids
(v1, train), (v2, val) = load("data/train.bin"), load("data/val.bin")
assert v1 == v2 == 1000, (v1, v2)
got = list(train) + list(val)
assert got == want, next(i for i, (a, b) in enumerate(zip(got + [-1], want + [-2])) if a != b)
assert len(train) == int(len(want) * 0.9)
wide = Tokenizer.from_file("wide.json")
(v1, a), (v2, b) = (load(f"wide/{p}.bin", 20240801, 7, np.uint32) for p in ("train", "val"))
assert v1 == v2 == 70001, (v1, v2)
assert list(a) + list(b) == [eot] + wide.encode("Hello <|big|> world<|big|>\n",
                                                add_special_tokens=False).ids
assert 70000 in list(a) + list(b)
print(f"ok: {len(want)} tokens, tokenizers' ids; uint32 files for a vocabulary of 70001")
PYEOF

# 2. training on them, the sample as text
GPT="--n_layer 1 --n_head 2 --n_embd 32 --block_size 16 --batch_size 4"
"$B/cddprun" --standalone --nproc_per_node 2 "$B/gpt_train" --data data/train.bin $GPT --max_iters 20 \
    --eval_interval 20 --eval_iters 2 --final_eval 2 --tokenizer tok.json --prompt "Why is" \
    --sample 30 --out run > train.out 2>&1 || { cat train.out; fail "training on the tokenizer's files failed"; }
grep -q "vocabulary 1000," train.out || { cat train.out; fail "the model's vocabulary is not the files' 1000"; }
grep -q "^Why is" train.out || { cat train.out; fail "the sample does not start with the prompt as text"; }

# 3. refusals, before any training
"$B/cddp-tokenize" text bytes > /dev/null || fail "cddp-tokenize (bytes) failed"
expect_refused() { # what, the words, then the command
    what=$1 words=$2
    shift 2
    "$@" > bad.out 2>&1 && { cat bad.out; fail "$what was accepted"; }
    grep -q "$words" bad.out || { cat bad.out; fail "$what: the message does not say '$words'"; }
    grep -q "^iter " bad.out && { cat bad.out; fail "$what was refused only after training"; }
    true
}
expect_refused "byte data for the tokenizer's model" \
    "bytes/train.bin: a vocabulary of 256 tokens (the byte tokenizer), where the model's is 1000" \
    "$B/gpt_train" --data bytes/train.bin --init_from run/checkpoint.safetensors --max_iters 5 --out none
"$B/gpt_train" --data bytes/train.bin $GPT --max_iters 2 --eval_interval 2 --eval_iters 1 --final_eval 1 \
    --sample 0 --out byterun > /dev/null 2>&1 || fail "training on bytes failed"
expect_refused "the tokenizer's data for a byte model" \
    "data/train.bin: a vocabulary of 1000 tokens, where the model's is 256 (the byte tokenizer)" \
    "$B/gpt_train" --data data/train.bin --init_from byterun/checkpoint.safetensors --max_iters 5 --out none
expect_refused "a text prompt without a tokenizer" \
    "give --tokenizer (its tokenizer.json) to encode it, or --prompt_ids" \
    "$B/gpt_train" --data data/train.bin $GPT --max_iters 5 --prompt "Hello" --out none
expect_refused "a tokenizer of another vocabulary" "the tokenizer tok.json: a vocabulary of 1000" \
    "$B/gpt_train" --data bytes/train.bin $GPT --max_iters 5 --tokenizer tok.json --out none

# 4. generation: the start token, the prompt through the tokenizer
eot=$("$py" -c 'from tokenizers import Tokenizer; print(Tokenizer.from_file("tok.json").token_to_id("<|endoftext|>"))')
ids=$("$py" -c 'from tokenizers import Tokenizer; print(",".join(map(str, Tokenizer.from_file("tok.json").encode("Why is").ids)))')
gen() { "$B/gpt_generate" "$model/checkpoint.safetensors" --temperature 0 --tokens 12 "$@" 2> /dev/null; }
# a GPT-2-sized model (50257) without a tokenizer: from GPT-2's <|endoftext|>, 50256 (llm.c's
# files record no vocabulary: a copy of train.bin with the header's fourth int32 zeroed)
mkdir -p llmc && cp data/train.bin llmc/train.bin && cp data/val.bin llmc/val.bin &&
    printf '\000\000\000\000' | dd of=llmc/train.bin bs=1 seek=12 conv=notrunc 2> /dev/null &&
    printf '\000\000\000\000' | dd of=llmc/val.bin bs=1 seek=12 conv=notrunc 2> /dev/null || fail "cannot copy"
"$B/gpt_train" --data llmc/train.bin $GPT --vocab_size 50257 --max_iters 1 --eval_interval 1 \
    --eval_iters 1 --final_eval 1 --sample 0 --out big > big.out 2>&1 || { cat big.out; fail "a 50257 model did not train"; }
grep -q "vocabulary 50257," big.out || { cat big.out; fail "--vocab_size 50257 was not the model's"; }
model=big
a=$(gen) && b=$(gen --prompt_ids 50256) || fail "gpt_generate failed"
[ "50256 $a" = "$b" ] || fail "a GPT-2-sized model's text from nothing ('$a') is not from 50256 ('$b')"
model=run
a=$(gen --tokenizer tok.json) && b=$(gen --tokenizer tok.json --prompt_ids "$eot") || fail "gpt_generate --tokenizer failed"
[ "<|endoftext|>$a" = "$b" ] || fail "from nothing: '$a', from <|endoftext|>: '$b'"
a=$(gen --tokenizer tok.json --prompt "Why is") && b=$(gen --tokenizer tok.json --prompt_ids "$ids") ||
    fail "gpt_generate --prompt failed"
[ "$a" = "$b" ] || fail "--prompt 'Why is' gives '$a', --prompt_ids $ids (tokenizers') '$b'"
# 5. to transformers and back
"$B/cddp-ckpt" export-hf --tokenizer tok.json run/checkpoint.safetensors hf > export.out 2>&1 ||
    { cat export.out; fail "export-hf failed"; }
for d in bf16 f16; do
    "$B/cddp-ckpt" export-hf --dtype $d run/checkpoint.safetensors hf_$d > export.out 2>&1 ||
        { cat export.out; fail "export-hf --dtype $d failed"; }
done
"$B/cddp-ckpt" export-hf --dtype f8 run/checkpoint.safetensors bad > bad.out 2>&1
[ $? = 2 ] && grep -q -- "--dtype f8: f32, bf16 or f16" bad.out || { cat bad.out; fail "--dtype f8 was not refused"; }
"$B/cddp-ckpt" export-hf --tokenizer wide.json run/checkpoint.safetensors bad > bad.out 2>&1 &&
    fail "a tokenizer of 70001 tokens was exported with a model of 1000"
grep -q "has 70001 tokens, more than the model's vocabulary of 1000" bad.out || { cat bad.out; fail "the tokenizer's refusal does not say why"; }
[ -e bad ] && fail "a refused export left files"
cddp_ids=$(gen --prompt_ids "$ids" --tokens 10) || fail "gpt_generate failed"
"$py" - "$ids" "$cddp_ids" <<'PYEOF' || fail "transformers does not take cddp's export as cddp has it"
import sys
import torch
from transformers import AutoTokenizer, GPT2LMHeadModel
from tokenizers import Tokenizer
prompt = [int(i) for i in sys.argv[1].split(",")]
want = [int(i) for i in sys.argv[2].split()]  # cddp's: the prompt, then 10 greedy tokens (in block_size 16)
m = GPT2LMHeadModel.from_pretrained("hf").eval()
with torch.no_grad():
    got = m.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=10,
                     attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                     pad_token_id=0)[0].tolist()
assert got == want, (got, want)
text = "Why is the sky blue? 42 reasons\n"
assert AutoTokenizer.from_pretrained("hf")(text).input_ids == Tokenizer.from_file("tok.json").encode(text).ids
sd = {k: v for k, v in m.state_dict().items() if not k.endswith(("attn.bias", "masked_bias"))}
for d, dt in (("bf16", torch.bfloat16), ("f16", torch.float16)):
    r = GPT2LMHeadModel.from_pretrained(f"hf_{d}", torch_dtype=dt).state_dict()
    for k, v in sd.items():
        assert r[k].dtype == dt and torch.equal(r[k], v.to(dt)), (d, k)
m.save_pretrained("back", safe_serialization=True)
print(f"ok: transformers generates cddp's {len(want) - len(prompt)} greedy tokens; bf16, f16 exact")
PYEOF
back=$("$B/gpt_generate" back/model.safetensors --temperature 0 --tokens 10 --prompt_ids "$ids" 2> /dev/null) ||
    fail "cddp cannot load what transformers saved"
[ "$back" = "$cddp_ids" ] || fail "from transformers' save: '$back', cddp's own: '$cddp_ids'"
echo "ok: the journey from text to tokens, training and text again"
