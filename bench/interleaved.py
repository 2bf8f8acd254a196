"""interleaved.py: what the Python benchmarks share: runs of a program that ends with one JSON
line, one run of every setting per round, the rounds interleaved so that every setting sees the
same machine."""
import json
import os
import statistics
import subprocess
import sys

PY = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else "python3"


def run_json(who, cmd, env):
    """Runs cmd; its last line of output as JSON, or exits naming the command and its stderr."""
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    last = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
    if out.returncode != 0 or not last.startswith("{"):
        sys.exit(f"{who}: {' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(last)


def rounds(who, settings, n):
    """settings: (name, cmd, env, extra fields). Prints "run NAME {json}" per run, the progress and
    the medians of tokens_per_s on stderr; returns the runs by name."""
    seen = {s[0]: [] for s in settings}
    for r in range(n):
        for name, cmd, env, extra in settings:
            j = run_json(who, cmd, env)
            j.update(extra)
            seen[name].append(j)
            print(f"run {name} {json.dumps(j)}", flush=True)
            print(f"round {r + 1} {name}: {j['tokens_per_s']:.0f} tokens/s", file=sys.stderr)
    print("medians (tokens/s): " + ", ".join(
        f"{k} {statistics.median(j['tokens_per_s'] for j in v):.0f}" for k, v in seen.items()),
        file=sys.stderr)
    return seen
