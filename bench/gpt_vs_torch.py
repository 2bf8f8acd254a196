#!/usr/bin/python3
"""gpt_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]: GPT training speed, cddp against PyTorch.

nanoGPT's CPU recipe (4 layers, 4 heads, width 128, context 64, batch 12 per rank, AdamW, the
gradients clipped at 1.0) on Debian's fortunes, ITERS iterations (default 60) per run, in six
settings, one run of each per round, the rounds interleaved so that every setting sees the same
machine (ROUNDS, default 5):

  cddp1      build/bin/gpt_train, one process, one math thread
  torch1     bench/gpt_torch.py, one process, torch.set_num_threads(1)
  cddp2      cddprun --nproc_per_node 2 gpt_train: DistributedDataParallel over shared memory,
             one thread per rank
  torchddp2  the same under cddprun: DistributedDataParallel over gloo
  cddp_all   one process with every core as math threads, the 2-rank runs' global batch (24):
  torch_all  what a user runs instead of data parallelism

Each run reports tokens per second over its training iterations (evaluation excluded). Prints one
line per run, "run SETTING {json}" (cddp's JSON holds its time split per iteration), for
bench/report.py, which writes the tables (medians and spreads, ratios, GFLOP/s); and the medians
on stderr as it goes.
"""
import os
import sys

from interleaved import PY, rounds

HERE = os.path.dirname(os.path.abspath(__file__))
B = 12


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: gpt_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]")
    build = sys.argv[1]
    n_rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    cores = os.cpu_count() or 1
    gpt = os.path.join(build, "bin", "gpt_train")
    launcher = os.path.join(build, "bin", "cddprun")
    torch_py = os.path.join(HERE, "gpt_torch.py")
    common = ["--max_iters", str(iters), "--batch_size", str(B)]
    cddp_args = common + ["--eval_interval", "100000", "--eval_iters", "1", "--final_eval", "1",
                          "--sample", "0", "--out", "none", "--log_interval", "0", "--json"]
    torch_args = common + ["--eval_batches", "1"]
    one = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CDDP_LOG_LEVEL="error")
    allc = dict(os.environ, OMP_NUM_THREADS=str(cores), OPENBLAS_NUM_THREADS=str(cores),
                CDDP_LOG_LEVEL="error")
    launch = [launcher, "--standalone", "--nproc_per_node", "2"]
    settings = [
        ("cddp1", [gpt] + cddp_args, one, {"threads": 1}),
        ("torch1", [PY, torch_py, "--threads", "1"] + torch_args, one, {"threads": 1}),
        ("cddp2", launch + [gpt] + cddp_args, one, {"threads": 1}),
        ("torchddp2", launch + [PY, torch_py, "--threads", "1"] + torch_args, one, {"threads": 1}),
        ("cddp_all", [gpt] + cddp_args + ["--batch_size", str(2 * B)], allc, {"threads": cores}),
        ("torch_all", [PY, torch_py, "--threads", str(cores)] + torch_args +
         ["--batch_size", str(2 * B)], allc, {"threads": cores}),
    ]
    rounds("gpt_vs_torch", settings, n_rounds)


if __name__ == "__main__":
    main()
