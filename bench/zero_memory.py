#!/usr/bin/python3
"""zero_memory.py BUILD_DIR [WORLDS] [T]: what each rank holds under DDP and the ZeRO stages, for
GPT-2 124M's shape (12 layers, 12 heads, width 768, context 1024, the vocabulary padded to 50304),
against the formula.

One AdamW iteration on random GPT-2 tokens, batch 1 x T (default 128: the model's state does not depend on it, its
activations do) per rank, float32, under cddprun on each world size of WORLDS (default "2,4"),
with --zero 0, 1 and 2 (DDP, ZeRO-1, ZeRO-2). Rank 0's bytes (gpt_train's JSON, from
cddp_ddp_memory_get) against the formula for P parameters on N ranks:

  stage  parameters  gradients  optimizer state (AdamW's m and v)
  DDP    4P          4P         8P
  ZeRO-1 4P          4P         8P / N
  ZeRO-2 4P          4P / N     8P / N

(a shard may hold one element more per bucket), and the process's peak resident memory beside
the state's sum: the rest is the step's activations, the program and its libraries. Prints one
line per run, then the table (the difference from the formula in percent).
"""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

SHAPE = ["--n_layer", "12", "--n_head", "12", "--n_embd", "768", "--vocab_size", "50304"]


def mib(b):
    return f"{b / 2**20:.1f}"


def tokens(folder):
    """Random GPT-2 tokens as llm.c's token files (a header of 256 int32, then uint16 tokens)."""
    rng = random.Random(1)
    for name, n in (("gpt2_train.bin", 1 << 16), ("gpt2_val.bin", 1 << 14)):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
            f.write(struct.pack(f"<{n}H", *(rng.randrange(50257) for _ in range(n))))
    return os.path.join(folder, "gpt2_train.bin")


def run(build, world, stage, t, data):
    cmd = [os.path.join(build, "bin", "cddprun"), "--standalone", "--nproc_per_node", str(world),
           os.path.join(build, "bin", "gpt_train")] + SHAPE + [
        "--block_size", str(t), "--batch_size", "1", "--max_iters", "1", "--eval_interval",
        "100000", "--eval_iters", "1", "--final_eval", "1", "--sample", "0", "--out", "none",
        "--log_interval", "0", "--json", "--zero", str(stage), "--data", data]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", CDDP_LOG_LEVEL="error")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        sys.exit(f"zero_memory: {' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-2000:]}")
    return json.loads(lines[-1])


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: zero_memory.py BUILD_DIR [WORLDS] [T]")
    build = sys.argv[1]
    worlds = [int(w) for w in (sys.argv[2] if len(sys.argv) > 2 else "2,4").split(",")]
    t = int(sys.argv[3]) if len(sys.argv) > 3 else 128
    rows = []
    with tempfile.TemporaryDirectory(prefix="zero_memory.") as folder:
        data = tokens(folder)
        for world in worlds:
            for stage in (0, 1, 2):
                j = run(build, world, stage, t, data)
                print("run", world, stage, json.dumps(j), flush=True)
                P = j["params"]
                want = (4 * P, 4 * P if stage < 2 else 4 * P / world,
                        8 * P if stage == 0 else 8 * P / world)
                got = (j["param_bytes"], j["grad_bytes"], j["optim_state_bytes"])
                rows.append((world, stage, got, want, j["peak_rss_bytes"]))
    print(f"\n| ranks | stage | parameters MiB | gradients MiB | optimizer MiB | sum MiB "
          f"| formula MiB | off | peak resident MiB (batch 1 x {t}) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world, stage, got, want, peak in rows:
        name = "DDP" if stage == 0 else f"ZeRO-{stage}"
        off = (sum(got) - sum(want)) / sum(want) * 100
        print(f"| {world} | {name} | {mib(got[0])} | {mib(got[1])} | {mib(got[2])} "
              f"| {mib(sum(got))} | {mib(sum(want))} | {off:+.2f} % | {mib(peak)} |")


if __name__ == "__main__":
    main()
