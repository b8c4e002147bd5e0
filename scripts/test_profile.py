"""Where the test suite's time goes, from the file `pytest --times FILE` writes (scripts/test.sh
writes .test-home/test-times.jsonl): per file (its tests' seconds, of which fixture set-up),
per pytest-xdist worker (busy, finished, idle while the other still ran).

    python scripts/test_profile.py .test-home/test-times.jsonl [--top 25]
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def profile(rows: list[dict], top: int) -> str:
    start, end = min(r["start"] for r in rows), max(r["stop"] for r in rows)
    files: dict[str, dict] = defaultdict(lambda: {"seconds": 0.0, "setup": 0.0, "tests": 0, "workers": set()})
    workers: dict[str, dict] = defaultdict(lambda: {"busy": 0.0, "last": start})
    for r in rows:
        f = files[r["test"].split("::")[0]]
        f["seconds"] += r["seconds"]
        f["setup"] += r["seconds"] if r["when"] == "setup" else 0.0
        f["tests"] += r["when"] == "call"
        f["workers"].add(r["worker"])
        w = workers[r["worker"]]
        w["busy"] += r["seconds"]
        w["last"] = max(w["last"], r["stop"])
    out = [f"tests: {sum(f['tests'] for f in files.values())} in {len(files)} files, "
           f"{end - start:.0f} s from the first to the last", "",
           "| worker | busy s | finished at s | idle at the end s |", "|---|---|---|---|"]
    for name, w in sorted(workers.items()):
        out.append(f"| {name} | {w['busy']:.0f} | {w['last'] - start:.0f} | {end - w['last']:.0f} |")
    out += ["", f"| file (the {top} slowest) | tests | seconds | of which set-up | worker |", "|---|---|---|---|---|"]
    for name, f in sorted(files.items(), key=lambda kv: -kv[1]["seconds"])[:top]:
        out.append(f"| {name} | {f['tests']} | {f['seconds']:.0f} | {f['setup']:.0f} | {', '.join(sorted(f['workers']))} |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("times", type=Path)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.times.read_text().splitlines() if line.strip()]
    print(profile(rows, args.top))


if __name__ == "__main__":
    main()
