#!/usr/bin/env python3
"""check_json.py: the GPU check's JSON, read and written here rather than taken apart in shell.

  check_json.py get PATH [DEFAULT] < OUTPUT
      the value at PATH (keys joined by dots: "bench.tokens_per_s", "iter_ms.forward") in the last
      line of OUTPUT that is a JSON object holding it; DEFAULT (or nothing) when none does.
      Numbers print as JSON writes them, strings bare.
  check_json.py result FILE WHAT IMPL VALUE UNIT CONFIG [KEY=JSON ...]
      appends one line of results.jsonl to FILE: the date, CHECK_COMMIT and CHECK_CARD from the
      environment, then the fields given; VALUE is a number, or null when empty, nan or inf; each
      KEY=JSON an extra field whose value is JSON text (true, 0.25, "a..b"), or a plain string
      when it is not JSON.

Only the standard library: it runs under whichever python3 the GPU machine has.
"""
import datetime
import json
import math
import os
import sys


def lookup(obj, path):
    for key in path.split("."):
        if not isinstance(obj, dict) or key not in obj:
            raise KeyError(path)
        obj = obj[key]
    return obj


def get(path, default):
    found = None
    for line in sys.stdin:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            found = lookup(json.loads(line), path)
        except (ValueError, KeyError):
            continue
    if found is None:
        if default is not None:
            print(default)
        return
    print(found if isinstance(found, str) else json.dumps(found))


def number(text):
    """A result's value: None (JSON's null) for none, nan or inf, which JSON cannot hold."""
    if text in ("", "null", "none"):
        return None
    value = float(text)
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() and not any(c in text for c in ".eE") else value


def result(path, what, impl, value, unit, config, extras):
    line = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": os.environ.get("CHECK_COMMIT", "unknown"),
            "card": os.environ.get("CHECK_CARD", ""),
            "what": what, "impl": impl, "value": number(value), "unit": unit, "config": config}
    for extra in extras:
        key, _, text = extra.partition("=")
        try:
            line[key] = json.loads(text)
        except ValueError:
            line[key] = text
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def main():
    args = sys.argv[1:]
    if len(args) >= 2 and args[0] == "get":
        get(args[1], args[2] if len(args) > 2 else None)
    elif len(args) >= 7 and args[0] == "result":
        result(*args[1:7], args[7:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
