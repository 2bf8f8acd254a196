#!/bin/sh
# report_test.sh: bench/report.py turns recorded bench/compare outputs (tests/bench/fixtures/)
# into the benchmark page, the plots and the README headline with the right numbers, and refuses
# outputs that are missing or report wrong results.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$(dirname "$here")")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
cp -r "$here/fixtures" "$work/out"
printf 'intro\n<!-- bench:headline:begin -->\nold\n<!-- bench:headline:end -->\nrest\n' > "$work/README.md"
python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" || fail "report.py failed on good outputs"
has() { grep -qF -- "$2" "$1" || fail "$1 lacks: $2"; }
# The best of each, the ratios and the verdicts, computed from the runs in the fixtures.
has "$work/B.md" "| cddp DDP (samples/s, best of 3) | 21670 | 32647 | 1.51x |"
has "$work/B.md" "| PyTorch 1.13.0a0 DDP, gloo | 17612 | 8016 | 0.46x |"
has "$work/B.md" "| cddp / PyTorch | 1.23x | **4.07x** | |"
has "$work/B.md" "- cddp on 2 ranks >= 1.7x cddp on 1 rank: 1.51x — **not met**"
has "$work/B.md" "- cddp on 2 ranks >= 3.5x PyTorch DDP on 2 ranks: 4.07x — **met**"
has "$work/B.md" "cddp's last step on 2 ranks: forward 0.38 ms, backward 0.61 ms, allreduce 0.35 ms in 2 buckets inline in backward, waited 0.00 ms after backward, overlap 0%."
has "$work/B.md" "| 1 MiB | 59.82 | 17.53 |"
has "$work/B.md" "busbw >= 2x Open MPI at 64 MiB, plain buffers: 6.29x Open MPI (8.77 vs 1.39 GB/s) — **met**"
has "$work/B.md" "| cddp | 20026 |"
has "$work/B.md" "| 4 | 1235030 | 21912 | 0.75% |"
has "$work/B.md" "| \`PyTorch gloo rendezvous + barrier (2 ranks)\` | 1637.1 ms | 1025.5 | 2221.7 | 10 |"
has "$work/B.md" "| 1 MiB | 552.0 | 1.90 | 617.2 | 1.70 | 1.12x |"
has "$work/B.md" "cddp is at least as fast at 2 of 3 sizes; from 1 MiB up, geometric mean 1.20x Open MPI's speed — **met**"
has "$work/B.md" "| cddp, 1 rank | 10954 | 10184-11708 | 10184 10954 11024 10239 11708 |"
has "$work/B.md" "| PyTorch DDP (gloo), 2 ranks | 11158 | 10381-11547 | 10882 11158 11547 11448 10381 |"
has "$work/B.md" "| 2 ranks | 26.9 | 51.4 | 4.1 | 1.3 | 50.1 |"
has "$work/B.md" "- cddp on 1 rank >= 1.4x PyTorch on 1 thread: 1.53x — **met**"
has "$work/B.md" "- cddp on 2 ranks >= 1.85x cddp on 1 rank: 1.72x — **not met**"
has "$work/B.md" "- cddp on 2 ranks against one process on every core: cddp 1.38x, PyTorch 3.83x"
has "$work/B.md" "| cddp ZeRO-1 (\`--zero\`) | 3397 | 3237-3837 | 301.5 | 18.4 MiB | 232 MiB |"
has "$work/B.md" "- cddp's step with ZeRO-1 <= 1.1x its DDP step: 1.087x — **met** (PyTorch's: 1.161x)"
has "$work/B.md" "- optimizer state per rank about 1/2 of DDP's on 2 ranks: 0.500 — **met** (PyTorch's: 0.503)"
has "$work/B.md" "| idle | 4 KiB | cddp (shm) | 1.1 [0.8-2.2] | 1.3 [1.0-2.6] | 1.2 |"
has "$work/B.md" "| loaded | 64 KiB | Open MPI (vader) | 12.8 [11.2-13.0] | 20.8 [17.1-22.4] | 1.6 |"
has "$work/B.md" "| loaded | 1 MiB | 2.3 3.6 4.4 | 5.1 4.2 3.0 | 2 of 3 |"
grep -q "@[A-Z_]*@" "$work/B.md" && fail "a placeholder was left in the page"
has "$work/README.md" "| DDP training, 2 ranks (samples/s) | 32647 | PyTorch DDP gloo 8016 | 4.07x |"
grep -q "^old$" "$work/README.md" && fail "the old headline is still in the README"
has "$work/README.md" "| GPT DDP training, 2 ranks (tokens/s, median) | 18877 | PyTorch DDP gloo 11158 | 1.69x |"
has "$work/README.md" "rest"
for f in allreduce_busbw ddp_throughput; do
    python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$work/img/$f.svg" ||
        fail "$f.svg is not well-formed XML"
done
has "$work/img/allreduce_busbw.svg" "Open MPI"
# Wrong results or a missing output: exit 1, a message naming the file, nothing written.
rm "$work/B.md"
echo 'WRONG RESULTS above' >> "$work/out/allreduce.txt"
if python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" 2> "$work/err"; then fail "accepted wrong results"; fi
has "$work/err" "allreduce.txt: an allreduce returned wrong results"
cp "$here/fixtures/allreduce.txt" "$work/out/allreduce.txt"
sed '1s/"wrong_inplace": 0/"wrong_inplace": 3/' "$here/fixtures/tails.jsonl" > "$work/out/tails.jsonl"
if python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" 2> "$work/err"; then fail "accepted wrong tails results"; fi
has "$work/err" "tails.jsonl: an allreduce returned wrong results"
cp "$here/fixtures/tails.jsonl" "$work/out/tails.jsonl"
rm "$work/out/ddp.txt"
if python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" 2> "$work/err"; then fail "accepted a missing output"; fi
has "$work/err" "ddp.txt"
[ ! -e "$work/B.md" ] || fail "a page was written from bad outputs"
cp "$here/fixtures/ddp.txt" "$work/out/ddp.txt"
grep -v "^run cddp2 " "$here/fixtures/gpt.txt" > "$work/out/gpt.txt"
if python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" 2> "$work/err"; then fail "accepted GPT runs without cddp2"; fi
has "$work/err" "gpt.txt"
cp "$here/fixtures/gpt.txt" "$work/out/gpt.txt"
grep -v "^run torch_zero " "$here/fixtures/zero.txt" > "$work/out/zero.txt"
if python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" 2> "$work/err"; then fail "accepted ZeRO runs without torch_zero"; fi
has "$work/err" "zero.txt: no runs of torch_zero"
[ ! -e "$work/B.md" ] || fail "a page was written from GPT outputs without a setting"
echo "ok: the benchmark report has the fixtures' numbers, plots and headline; bad outputs refused"
