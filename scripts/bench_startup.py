"""Times whole `python -m specbeam.translate` processes of two checkouts side by side.

    git worktree add /tmp/base main
    python scripts/bench_startup.py --baseline /tmp/base --repeats 5
    python scripts/bench_startup.py --baseline /tmp/base --input FILE --repeats 3

Each round runs the baseline's process, then this checkout's (or `--candidate`'s), on the
same input (default: one line, "Hola", from stdin) with the same interpreter and
arguments; each checkout runs its own code and shipped files (PYTHONPATH). Prints every
process's wall and CPU seconds, then the min and median per checkout, and fails if their
outputs differ. Run it alone on the machine (e.g. under `flock`): nothing else is timed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


@dataclass
class Runs:
    name: str
    checkout: Path
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    outputs: set[bytes] = field(default_factory=set)


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(runs: Runs, stdin: bytes, args: list[str]) -> None:
    """One process: its wall time, its CPU time (user + system), its stdout."""
    env = {**os.environ, "PYTHONPATH": str(runs.checkout)}
    cpu = children_cpu()
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "specbeam.translate", *args],
        input=stdin, capture_output=True, cwd=runs.checkout, env=env, check=False,
    )  # fmt: skip
    runs.wall.append(time.perf_counter() - start)
    runs.cpu.append(children_cpu() - cpu)
    if result.returncode != 0:
        sys.exit(f"{runs.name} failed:\n{result.stderr.decode(errors='replace')}")
    runs.outputs.add(result.stdout)


def summary(runs: Runs) -> str:
    wall, cpu = runs.wall, runs.cpu
    return (
        f"{runs.name:9s} wall min {min(wall):.2f} median {statistics.median(wall):.2f} s; "
        f"CPU min {min(cpu):.2f} median {statistics.median(cpu):.2f} s ({runs.checkout})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="a checkout to compare with")
    parser.add_argument("--candidate", type=Path, default=HERE, help="default: this checkout")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--input", type=Path, help="a file to translate (input=FILE)")
    parser.add_argument("--line", default="Hola", help="the stdin line without --input")
    parser.add_argument("args", nargs="*", help="more translate arguments, e.g. decoding=beam")
    opts = parser.parse_args()
    args, stdin = list(opts.args), b""
    if opts.input:
        args.append(f"input={opts.input.resolve()}")
    else:
        stdin = (opts.line + "\n").encode()
    checkouts = [
        Runs("baseline", opts.baseline.resolve()),
        Runs("candidate", opts.candidate.resolve()),
    ]
    for r in range(opts.repeats):
        for runs in checkouts:
            run_once(runs, stdin, args)
        print(
            f"round {r + 1}: "
            + ", ".join(f"{c.name} {c.wall[-1]:.2f} s (CPU {c.cpu[-1]:.2f})" for c in checkouts),
            flush=True,
        )
    for runs in checkouts:
        print(summary(runs))
    base, cand = checkouts
    print(
        f"median wall ratio baseline/candidate: {statistics.median(base.wall) / statistics.median(cand.wall):.2f}"
    )
    outputs = base.outputs | cand.outputs
    if len(outputs) != 1:
        sys.exit(f"outputs differ: {len(outputs)} distinct stdouts")
    print("outputs: identical in every process")


if __name__ == "__main__":
    main()
