#!/usr/bin/python3
"""zero_stages.py BUILD_DIR [ROUNDS] [ITERS]: the ZeRO stages and activation checkpointing against
plain DDP on 2 ranks of this CPU: speed and what each rank holds.

The GPT of 6 layers, 6 heads, width 384, context 64 (10.8M parameters: 43 MB of gradients), batch
8 per rank, ITERS iterations (default 30), one math thread per rank, under cddprun on 2 ranks,
one run of each setting per round, the rounds interleaved (ROUNDS, default 3):

  ddp    gpt_train            DistributedDataParallel: every rank holds every gradient and state
  zero1  gpt_train --zero 1   ZeRO-1: reduce-scatter, each rank's shard of the state, allgather
  zero2  gpt_train --zero 2   ZeRO-2: as ZeRO-1, and each rank keeps its shard of the gradients
  ddp_ac   gpt_train --activation_checkpointing: DDP, each block's input kept, the block run again
  zero2_ac gpt_train --zero 2 --activation_checkpointing

Prints one line per run ("run SETTING {json}": rank 0's tokens_per_s, grad_bytes,
optim_state_bytes, peak_rss_bytes), then a table: the median tokens/s of each setting with the
rounds' range and its ratio to DDP's, and rank 0's bytes.
"""
import os
import statistics
import sys

from interleaved import rounds

MODEL = ["--n_layer", "6", "--n_head", "6", "--n_embd", "384", "--block_size", "64",
         "--batch_size", "8"]


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: zero_stages.py BUILD_DIR [ROUNDS] [ITERS]")
    build = sys.argv[1]
    n_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    iters = sys.argv[3] if len(sys.argv) > 3 else "30"
    gpt = [os.path.join(build, "bin", "cddprun"), "--standalone", "--nproc_per_node", "2",
           os.path.join(build, "bin", "gpt_train")] + MODEL + [
        "--max_iters", iters, "--eval_interval", "100000", "--eval_iters", "1", "--final_eval",
        "1", "--sample", "0", "--out", "none", "--log_interval", "0", "--json"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CDDP_LOG_LEVEL="error")
    ac = ["--activation_checkpointing"]
    seen = rounds("zero_stages", [("ddp", gpt, env, {}), ("zero1", gpt + ["--zero", "1"], env, {}),
                                  ("zero2", gpt + ["--zero", "2"], env, {}),
                                  ("ddp_ac", gpt + ac, env, {}),
                                  ("zero2_ac", gpt + ["--zero", "2"] + ac, env, {})], n_rounds)
    base = statistics.median(j["tokens_per_s"] for j in seen["ddp"])
    print("| setting | tokens/s (median) | range | vs DDP | gradients | optimizer state "
          "| peak resident |")
    print("|---|---|---|---|---|---|---|")
    for name, runs in seen.items():
        t = [j["tokens_per_s"] for j in runs]
        last = runs[-1]
        print(f"| {name} | {statistics.median(t):.0f} | {min(t):.0f}-{max(t):.0f} "
              f"| {statistics.median(t) / base:.3f} | {mib(last['grad_bytes'])} "
              f"| {mib(last['optim_state_bytes'])} "
              f"| {mib(statistics.median(j['peak_rss_bytes'] for j in runs))} |")


if __name__ == "__main__":
    main()
