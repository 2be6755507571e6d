"""The booking example's fake API, shared by its three tools: JSON files in
a store directory (STORE, relative to the example directory by default)."""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def store():
    s = os.environ.get("STORE") or "data"
    return s if os.path.isabs(s) else os.path.join(HERE, "..", s)


def read(name, default):
    try:
        with open(os.path.join(store(), name)) as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def log(name, line):
    with open(os.path.join(store(), name), "a") as f:
        f.write(line + "\n")


def args(argv):
    """`--name value` pairs of the bash tool protocol's dashdashspace mode."""
    out, i = {}, 0
    while i < len(argv):
        if not argv[i].startswith("--") or i + 1 >= len(argv):
            sys.exit(f"unexpected argument {argv[i]}")
        out[argv[i][2:]] = argv[i + 1]
        i += 2
    return out


def authorized():
    if not os.environ.get("API_KEY"):
        print("HTTP 401: no API key", file=sys.stderr)
        sys.exit(3)
