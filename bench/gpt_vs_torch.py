#!/usr/bin/python3
"""gpt_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]: GPT training speed, cddp against PyTorch.

nanoGPT's CPU recipe (4 layers, 4 heads, width 128, context 64, batch 12 per rank, AdamW, the
gradients clipped at 1.0) on Debian's fortunes, ITERS iterations (default 60) per run, in six
settings, one run of each per round, the rounds interleaved so that every setting sees the same
machine (ROUNDS, default 5):

  cddp 1 rank        build/bin/gpt_train, one process, one math thread
  PyTorch 1 thread   bench/gpt_torch.py, one process, torch.set_num_threads(1)
  cddp 2 ranks       cddprun --nproc_per_node 2 gpt_train: DistributedDataParallel over
                     shared memory, one thread per rank
  PyTorch DDP 2      the same under cddprun: DistributedDataParallel over gloo
  cddp 1 x all cores one process with every core as math threads: what a user runs instead of
  PyTorch all cores  data parallelism (the same global batch as the 2-rank runs: 24)

Each run reports tokens per second over its training iterations (evaluation excluded). Prints, per
setting, every round, the median and the spread (min-max); the ratios of the medians the targets
are about; cddp's time split per iteration (forward, backward, allreduce, optimizer) from its
JSON; and the model's arithmetic rate (GFLOP/s: 3 x the forward's multiply-adds x 2, the
attention counted whole).
"""
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"
L, NH, C, T, B, V = 4, 4, 128, 64, 12, 256


def flops_per_token():
    per_layer = 2 * (C * 3 * C + C * C + C * 4 * C + 4 * C * C) + 2 * 2 * T * C
    return 3 * (L * per_layer + 2 * C * V)


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not last.startswith("{"):
        sys.exit(f"gpt_vs_torch: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(last)


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: gpt_vs_torch.py BUILD_DIR [ROUNDS] [ITERS]")
    build = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
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
        ("cddp 1 rank", [gpt] + cddp_args, one),
        ("PyTorch 1 thread", [PY, torch_py, "--threads", "1"] + torch_args, one),
        ("cddp 2 ranks", launch + [gpt] + cddp_args, one),
        ("PyTorch DDP 2 ranks (gloo)", launch + [PY, torch_py, "--threads", "1"] + torch_args, one),
        (f"cddp 1 process x {cores} threads",
         [gpt] + cddp_args[:] + ["--batch_size", str(2 * B)], allc),
        (f"PyTorch 1 process x {cores} threads",
         [PY, torch_py, "--threads", str(cores)] + torch_args + ["--batch_size", str(2 * B)], allc),
    ]
    results = {name: [] for name, _, _ in settings}
    splits = {name: [] for name, _, _ in settings}
    for r in range(rounds):
        for name, cmd, env in settings:
            j = run(cmd, env)
            results[name].append(j["tokens_per_s"])
            if "iter_ms" in j:
                splits[name].append(j["iter_ms"])
            print(f"round {r + 1} {name}: {j['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"GPT training, nanoGPT's CPU recipe ({L} layers, {NH} heads, width {C}, context {T}, "
          f"batch {B} per rank), {iters} iterations per run, {rounds} rounds interleaved\n")
    print("| setting | tokens/s median | spread (min-max) | rounds |")
    print("|---|---|---|---|")
    for name, _, _ in settings:
        v = results[name]
        print(f"| {name} | {med[name]:.0f} | {min(v):.0f}-{max(v):.0f} | "
              f"{' '.join(f'{x:.0f}' for x in v)} |")
    names = [n for n, _, _ in settings]
    print("\n| ratio (medians) | value | target |")
    print("|---|---|---|")
    print(f"| cddp 1 rank / PyTorch 1 thread | {med[names[0]] / med[names[1]]:.2f}x | >= 1.4x |")
    print(f"| cddp 2 ranks / PyTorch DDP 2 ranks | {med[names[2]] / med[names[3]]:.2f}x | >= 1.4x |")
    print(f"| cddp 2 ranks / cddp 1 rank | {med[names[2]] / med[names[0]]:.2f}x | >= 1.85x |")
    print(f"| cddp 2 ranks / cddp 1 process x {cores} threads | "
          f"{med[names[2]] / med[names[4]]:.2f}x | |")
    print(f"| cddp 2 ranks / PyTorch 1 process x {cores} threads | "
          f"{med[names[2]] / med[names[5]]:.2f}x | |")
    fpt = flops_per_token()
    print("\ncddp's iteration (medians over the rounds, ms):\n")
    print("| setting | forward | backward | allreduce | optimizer | model GFLOP/s per rank |")
    print("|---|---|---|---|---|---|")
    for name in names[0], names[2]:
        s = splits[name]
        world = 2 if "2 ranks" in name else 1
        part = {k: statistics.median(x[k] for x in s) for k in s[0]}
        print(f"| {name} | {part['forward']:.1f} | {part['backward']:.1f} | "
              f"{part['allreduce']:.1f} | {part['optimizer']:.1f} | "
              f"{med[name] / world * fpt / 1e9:.1f} |")


if __name__ == "__main__":
    main()
