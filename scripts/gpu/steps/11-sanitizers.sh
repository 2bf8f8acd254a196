# shellcheck shell=bash disable=SC2154 # check.sh's and lib.sh's variables
# 11-sanitizers.sh: compute-sanitizer racecheck, synccheck, initcheck; memcheck and racecheck on the GPT
# On device_check, then on two iterations of the tiny GPT (with its sampling).
gpt_step=(--device cuda --n_layer 2 --n_head 4 --n_embd 64 --block_size 32 --batch_size 4
    --max_iters 2 --eval_interval 1000 --eval_iters 1 --final_eval 1 --sample 8 --out none
    --data "$data/fortunes")
sanitize racecheck 60
sanitize synccheck 45
sanitize initcheck 45
sanitize memcheck 60 gpt_train "${gpt_step[@]}"
sanitize racecheck 90 gpt_train "${gpt_step[@]}"
