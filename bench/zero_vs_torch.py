#!/usr/bin/python3
"""zero_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]: the sharded optimizer (ZeRO-1) against plain DDP,
in cddp and in PyTorch, on 2 ranks: speed and memory.

A GPT bigger than nanoGPT's CPU recipe, so that the optimizer's state weighs something next to
the rest of a process (6 layers, 8 heads, width 256, context 64: 4.8M parameters, AdamW's state
38 MB), batch 8 per rank, ITERS iterations (default 30), one math thread per rank, under cddprun
on 2 ranks, four settings, one run of each per round, the rounds interleaved (ROUNDS, default 3):

  cddp_ddp    gpt_train                 DistributedDataParallel, every rank holds all the state
  cddp_zero   gpt_train --zero          ZeRO-1: reduce-scatter, each rank's shard, allgather
  torch_ddp   bench/gpt_torch.py        PyTorch DDP over gloo, torch.optim.AdamW
  torch_zero  bench/gpt_torch.py --zero PyTorch DDP with ZeroRedundancyOptimizer(AdamW)

Prints one line per run ("run SETTING {json}", with rank 0's optim_state_bytes and
peak_rss_bytes) for bench/report.py, which writes the table (medians, spreads, memory) and the
verdicts; and the medians on stderr.
"""
import os
import sys

from interleaved import PY, rounds

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = ["--n_layer", "6", "--n_head", "8", "--n_embd", "256", "--block_size", "64",
         "--batch_size", "8"]


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: zero_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]")
    build = sys.argv[1]
    n_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    iters = sys.argv[3] if len(sys.argv) > 3 else "30"
    launch = [os.path.join(build, "bin", "cddprun"), "--standalone", "--nproc_per_node", "2"]
    gpt = launch + [os.path.join(build, "bin", "gpt_train")] + MODEL + [
        "--max_iters", iters, "--eval_interval", "100000", "--eval_iters", "1", "--final_eval",
        "1", "--sample", "0", "--out", "none", "--log_interval", "0", "--json"]
    torch = launch + [PY, os.path.join(HERE, "gpt_torch.py"), "--threads", "1"] + MODEL + [
        "--max_iters", iters, "--eval_batches", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CDDP_LOG_LEVEL="error")
    settings = [("cddp_ddp", gpt, env, {}), ("cddp_zero", gpt + ["--zero"], env, {}),
                ("torch_ddp", torch, env, {}), ("torch_zero", torch + ["--zero"], env, {})]
    rounds("zero_vs_torch", settings, n_rounds)


if __name__ == "__main__":
    main()
