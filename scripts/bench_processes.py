"""Whole `python -m specbeam.translate` processes side by side, as users run them.

    .venv/bin/python scripts/bench_processes.py                 # every 15th test verse, one at a time
    .venv/bin/python scripts/bench_processes.py --every 5 --batched
    .venv/bin/python scripts/bench_processes.py --run int8='hardware.target_dtype=int8' \
        --run lean_int8='decoding=beam_lean hardware.target_dtype=int8' --compare int8/lean_int8
    git worktree add /tmp/base main                             # start-up of two checkouts
    .venv/bin/python scripts/bench_processes.py --line Hola --rounds 5 \
        --run base= --checkout base=/tmp/base --run this= --compare this/base

A run is a name and its translate overrides (`--run NAME=OVERRIDES`; empty: the shipped
defaults), in this checkout or in another (`--checkout NAME=PATH`: that tree's code and
shipped files, through PYTHONPATH). Without `--run`, the decodings users choose between:
fairseq2's beam and greedy search, the exact defaults, relaxed beam search and exact
speculative greedy. Every round runs each run once, in a rotated order, on the same input,
with the same interpreter and threads; start-up is included, as users wait for it.

Per run: min and median wall seconds, the process's CPU seconds, the CPU time all other
processes took meanwhile (the machine's noise), BLEU against the references where there are
some. Per comparison A/B: B's time over A's (so > 1: A is faster), and how many of A's
lines are B's. Writes processes.md, processes.json and processes.png to `--out`. Run it
alone on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib
from bench_ctranslate2 import others_cpu, processes
from sacrebleu.metrics import BLEU
from tqdm import tqdm

from specbeam.kernels.cpu import cpu_kind

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]  # scripts run from a checkout

DEFAULT_RUNS = {
    "beam": "decoding=beam",
    "defaults": "",
    "relaxed": "decoding=relaxed",
    "greedy": "decoding=greedy",
    "spec_greedy": "decoding=spec_greedy",
}
DEFAULT_COMPARISONS = ["defaults/beam", "relaxed/beam", "relaxed/defaults", "spec_greedy/greedy"]


@dataclass
class Run:
    name: str
    overrides: list[str]
    checkout: Path
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    others_cpu: list[float] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # the last round's output

    def once(self, args: list[str], stdin: bytes, scratch: Path) -> None:
        """One process: wall and CPU time, the others' CPU time meanwhile, its output."""
        output = scratch / f"{self.name}.out"
        output.unlink(missing_ok=True)
        cmd = [sys.executable, "-m", "specbeam.translate", *args, *self.overrides,
               f"output={output}", f"hydra.run.dir={scratch}/hydra_{self.name}"]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(self.checkout)}
        before, cpu, started = processes(), children_cpu(), time.perf_counter()
        result = subprocess.run(cmd, cwd=self.checkout, env=env, input=stdin,
                                capture_output=True, check=False)  # fmt: skip
        wall, after = time.perf_counter() - started, processes()
        if result.returncode != 0:
            error = result.stderr.decode(errors="replace")[-3000:]
            sys.exit(f"{self.name} failed: {shlex.join(cmd)}\n{error}")
        self.wall.append(wall)
        self.cpu.append(children_cpu() - cpu)
        self.others_cpu.append(others_cpu(before, after, os.getpid()))
        self.lines = output.read_text(encoding="utf-8").splitlines()

    def row(self, metric: BLEU, refs: list[str] | None) -> dict[str, object]:
        bleu = metric.corpus_score(self.lines, [refs]).score if refs else None
        return {
            "run": self.name,
            "overrides": " ".join(self.overrides),
            "checkout": str(self.checkout),
            "wall_min": min(self.wall),
            "wall_median": statistics.median(self.wall),
            "cpu_median": statistics.median(self.cpu),
            "others_cpu_max": max(self.others_cpu),
            "bleu": None if bleu is None else round(bleu, 2),
            "walls": self.wall,
        }


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compare(a: Run, b: Run) -> dict[str, object]:
    same = sum(x == y for x, y in zip(a.lines, b.lines, strict=True))
    return {
        "comparison": f"{a.name}/{b.name}",
        "ratio_median": statistics.median(b.wall) / statistics.median(a.wall),
        "ratio_min": min(b.wall) / min(a.wall),
        "same_lines": same,
        "lines": len(a.lines),
    }


def test_verses(every: int, limit: int | None) -> tuple[list[str], list[str]]:
    """Every `every`-th verse of the embedded task's test split, and its references."""
    from specbeam.data.task import TaskConfig

    pairs = TaskConfig().split("test")[::every][:limit]
    return [p.source for p in pairs], [p.target for p in pairs]


def parse_pairs(values: list[str], flag: str) -> dict[str, str]:
    found = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if not sep or not name:
            sys.exit(f"error: {flag} {value!r} is invalid: expected NAME=VALUE")
        found[name] = rest
    return found


def markdown(rows: list[dict], comparisons: list[dict], header: str, signature: str) -> str:
    lines = [header, "", "| run | overrides | wall min s | wall median s | CPU median s | "
             "others' CPU max s | BLEU |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        bleu = "–" if r["bleu"] is None else f"{r['bleu']:.2f}"
        lines.append(
            f"| {r['run']} | `{r['overrides'] or '(defaults)'}` | {r['wall_min']:.2f} | "
            f"{r['wall_median']:.2f} | {r['cpu_median']:.2f} | {r['others_cpu_max']:.2f} | {bleu} |"
        )
    lines += ["", "| A / B | B's time ÷ A's: median | min | A's lines equal to B's |",
              "|---|---|---|---|"]  # fmt: skip
    for c in comparisons:
        lines.append(
            f"| {c['comparison']} | {c['ratio_median']:.2f} | {c['ratio_min']:.2f} | "
            f"{c['same_lines']}/{c['lines']} |"
        )
    if signature:
        lines += ["", f"BLEU: `{signature}`"]
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], header: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(rows) + 1.5))
    names = [r["run"] for r in rows][::-1]
    ax.barh(names, [r["wall_median"] for r in rows][::-1], color="tab:blue", label="median")
    ax.scatter([r["wall_min"] for r in rows][::-1], names, color="black", zorder=3, label="min")
    ax.set_xlabel("seconds per process (start-up included)")
    ax.set_title("\n".join(textwrap.wrap(header.replace("`", ""), 90)), fontsize=8)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", action="append", default=[], metavar="NAME=OVERRIDES")
    parser.add_argument("--checkout", action="append", default=[], metavar="NAME=PATH")
    parser.add_argument("--compare", action="append", default=[], metavar="A/B")
    parser.add_argument("--every", type=int, default=15, help="every n-th test verse")
    parser.add_argument("--limit", type=int, help="at most n verses")
    parser.add_argument("--input", type=Path, help="a file to translate instead of test verses")
    parser.add_argument("--refs", type=Path, help="its references, for BLEU")
    parser.add_argument("--line", help="one line on stdin instead (start-up)")
    parser.add_argument("--batched", action="store_true", help="default batching; "
                        "else one sentence at a time (hardware.batch_tokens=1)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench_out" / "processes")
    parser.add_argument("args", nargs="*", help="overrides for every run, e.g. model=tiny_random")
    opts = parser.parse_args()

    runs_given = parse_pairs(opts.run, "--run") or DEFAULT_RUNS
    checkouts = {n: Path(p).resolve() for n, p in parse_pairs(opts.checkout, "--checkout").items()}
    wanted = opts.compare or ([] if opts.run else DEFAULT_COMPARISONS)
    for name in [*checkouts, *(n for c in wanted for n in c.split("/"))]:
        if name not in runs_given:
            sys.exit(f"error: {name!r} names no run; runs: {', '.join(runs_given)}")
    runs = [Run(n, shlex.split(o), checkouts.get(n, REPO_ROOT)) for n, o in runs_given.items()]

    opts.out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="processes-", dir=opts.out))
    args, stdin, refs = list(opts.args), b"", None
    if opts.line is not None:
        stdin, what = (opts.line + "\n").encode(), f"one line on stdin ({opts.line!r})"
    else:
        if opts.input:
            source = opts.input.resolve()
            refs = opts.refs and opts.refs.read_text(encoding="utf-8").splitlines()
            what = f"{source}"
        else:
            sources, refs = test_verses(opts.every, opts.limit)
            source = scratch / "test.src"
            source.write_text("\n".join(sources) + "\n", encoding="utf-8")
            what = f"{len(sources)} test verses (every {opts.every}th)"
        args.append(f"input={source}")
    if not opts.batched:
        args.append("hardware.batch_tokens=1")
        what += ", one at a time"

    progress = tqdm(
        total=opts.rounds * len(runs), desc="processes", unit="process", file=sys.stderr
    )
    for r in range(opts.rounds):
        for run in runs[r % len(runs) :] + runs[: r % len(runs)]:
            run.once(args, stdin, scratch)
            progress.update()
    progress.close()

    header = (f"`lscpu`: {cpu_kind()}, {os.cpu_count()} CPUs; {what}; {opts.rounds} rounds; "
              f"shared overrides: `{' '.join(opts.args) or '(none)'}`")  # fmt: skip
    metric = BLEU()
    rows = [run.row(metric, refs) for run in runs]
    by_name = {run.name: run for run in runs}
    comparisons = [compare(*(by_name[n] for n in c.split("/"))) for c in wanted]
    signature = str(metric.get_signature()) if refs else ""
    text = markdown(rows, comparisons, header, signature)
    (opts.out / "processes.md").write_text(text)
    (opts.out / "processes.json").write_text(
        json.dumps(
            {
                "header": header,
                "runs": rows,
                "comparisons": comparisons,
                "bleu_signature": signature,
            },
            indent=1,
        )  # fmt: skip
    )
    plot(rows, header, opts.out / "processes.png")
    print(text)


if __name__ == "__main__":
    main()
