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
grep -q "@[A-Z_]*@" "$work/B.md" && fail "a placeholder was left in the page"
has "$work/README.md" "| DDP training, 2 ranks (samples/s) | 32647 | PyTorch DDP gloo 8016 | 4.07x |"
grep -q "^old$" "$work/README.md" && fail "the old headline is still in the README"
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
rm "$work/out/ddp.txt"
if python3 "$root/bench/report.py" "$work/out" "$root/bench/BENCHMARKS.md.in" "$work/B.md" \
    "$work/img" "$work/README.md" 2> "$work/err"; then fail "accepted a missing output"; fi
has "$work/err" "ddp.txt"
[ ! -e "$work/B.md" ] || fail "a page was written from bad outputs"
echo "ok: the benchmark report has the fixtures' numbers, plots and headline; bad outputs refused"
