"""bench/tokenizer.py [BUILD_DIR] [ROUNDS]: cddp's byte-level BPE tokenizer against Hugging Face's
tokenizers (PyPI's, in .pyenv: run with .pyenv/bin/python), on one thread.

make_tokenizers.py trains a GPT-2-style and a Llama 3-style tokenizer on the fortunes and writes
the texts (the fortunes, 2.5 MB; Python's sources, 0.8 MB; man pages, 0.7 MB); then, ROUNDS times
in turn (default 5), tokenizers encodes each text two ways, one call on the whole text and
encode_batch over its lines (RAYON_NUM_THREADS=1: one thread), and cddp encodes it whole
(tokenizer_check, which also checks that the ids are the same). Prints every round's MB/s, then
per tokenizer and text the medians, their spread (min-max) and cddp over tokenizers' faster way.
Target: cddp at least as fast as tokenizers on one thread.
"""
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
from tokenizers import Tokenizer  # noqa: E402

here = os.path.dirname(os.path.abspath(__file__))
build = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "build"))
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
work = tempfile.mkdtemp()
subprocess.run([sys.executable, os.path.join(here, "..", "tests", "tokenizer", "make_tokenizers.py"),
                work], check=True)
texts = ("fortunes", "python", "man")
kinds = ("gpt2", "llama3")
text = {t: open(f"{work}/{t}.txt", encoding="utf-8").read() for t in texts}
size = {t: len(text[t].encode("utf-8")) for t in texts}
lines = {t: text[t].splitlines(keepends=True) for t in texts}
toks = {k: Tokenizer.from_file(f"{work}/{k}/tokenizer.json") for k in kinds}
speed = {}  # (who, kind, text) -> [MB/s]
for r in range(rounds):
    for k in kinds:
        for t in texts:
            start = time.perf_counter()
            toks[k].encode(text[t], add_special_tokens=False)
            whole = size[t] / (time.perf_counter() - start) / 1e6
            start = time.perf_counter()
            toks[k].encode_batch(lines[t], add_special_tokens=False)
            batch = size[t] / (time.perf_counter() - start) / 1e6
            speed.setdefault(("tokenizers whole", k, t), []).append(whole)
            speed.setdefault(("tokenizers lines", k, t), []).append(batch)
    out = subprocess.run([f"{build}/bin/tokenizer_check", work], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit("tokenizer_check failed:\n" + out.stdout)
    for line in out.stdout.splitlines():
        m = re.match(r"(\w+)/tokenizer\.json\s+(\w+)\s+\d+ bytes .* ([\d.]+) MB/s", line)
        if m and m.group(1) in kinds and m.group(2) in texts:
            speed.setdefault(("cddp", m.group(1), m.group(2)), []).append(float(m.group(3)))
    print(f"round {r + 1}: " + ", ".join(f"{who} {k} {t} {v[-1]:.2f}"
                                         for (who, k, t), v in sorted(speed.items())))
print(f"\nMB/s on one thread, median (min-max) of {rounds} rounds:")
print(f"{'tokenizer':8} {'text':9} {'cddp':>20} {'tokenizers whole':>20} {'tokenizers lines':>20}"
      f" {'cddp / best':>12}")
for k in kinds:
    for t in texts:
        cells, med = [], {}
        for who in ("cddp", "tokenizers whole", "tokenizers lines"):
            v = speed[(who, k, t)]
            med[who] = statistics.median(v)
            cells.append(f"{med[who]:.2f} ({min(v):.2f}-{max(v):.2f})")
        best = max(med["tokenizers whole"], med["tokenizers lines"])
        print(f"{k:8} {t:9} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20} "
              f"{med['cddp'] / best:>11.1f}x")
subprocess.run(["rm", "-rf", work])
