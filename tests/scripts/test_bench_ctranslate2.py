"""scripts/bench_ctranslate2.py: the engines `--engines` picks, other processes' CPU time
(another process's counted, this one's not, never negative), and a --quick run: every
engine chosen in its own process, the table, the JSON and the plot written, the fp32
rows identical to fairseq2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specbeam.kernels import onednn
from tests.scripts.conftest import REPO

BASE, SPEC = "fairseq2 beam", "specbeam spec_beam"


def test_engines_are_picked_by_name_or_part_of_one(script) -> None:
    bench = script("bench_ctranslate2")
    every = bench.engines(["float32", "bfloat16", "int8"])
    assert every == [
        BASE, SPEC, f"{SPEC}+bfloat16", f"{SPEC}+int8",
        "CTranslate2 float32", "CTranslate2 int8", "CTranslate2 int8_float32",
    ]  # fmt: skip
    assert bench.engines(["float32", "int8"]) == [e for e in every if "bfloat16" not in e]
    assert bench.engines(["float32"]) == [e for e in every if "+" not in e]
    assert bench.choose(every, None) == every
    assert bench.choose(every, [SPEC]) == [BASE, SPEC]  # a whole name: that engine alone
    int8 = [BASE, f"{SPEC}+int8", "CTranslate2 int8", "CTranslate2 int8_float32"]
    assert bench.choose(every, ["int8"]) == int8
    assert bench.choose(every, ["CTranslate2 int8", "bfloat16"]) == [
        BASE, f"{SPEC}+bfloat16", "CTranslate2 int8",
    ]  # fmt: skip
    with pytest.raises(SystemExit, match="--engines fp16: no such engine here"):
        bench.choose(every, ["int8", "fp16"])


def test_others_cpu_counts_reaped_children_and_new_processes_not_ours(script) -> None:
    others_cpu = script("bench_ctranslate2").others_cpu
    me = 100
    # (pid, start) -> (parent, own s, reaped children's s)
    before = {
        (1, 0): (0, 5.0, 50.0),
        (me, 7): (1, 3.0, 0.0),
        (101, 8): (me, 1.0, 0.0),  # our child
        (102, 9): (101, 1.0, 0.0),  # our grandchild, ends: reaped by our child
        (200, 9): (1, 2.0, 1.0),
        (300, 9): (200, 4.0, 0.5),  # ends, reaped by 200 at 4.25 + 0.5
        (400, 9): (2, 8.0, 0.0),  # a kernel thread: ends, reaped by no one
    }
    after = {
        (1, 0): (0, 5.0, 50.0),
        (me, 7): (1, 9.0, 0.0),
        (101, 8): (me, 2.0, 4.0),
        (200, 9): (1, 2.5, 1.0 + 4.75),
        (300, 12): (1, 0.25, 0.0),  # a new process on an ended one's pid
    }
    assert others_cpu(before, after, me) == pytest.approx(0.5 + 0.25 + 0.25)
    assert others_cpu(before, before, me) == 0.0


SPIN = """
import os, sys, time
while time.process_time() < 0.3:
    pass
print(os.getpid(), flush=True)
time.sleep(60)
"""


def test_others_cpu_sees_another_process_and_not_this_one(script) -> None:
    bench = script("bench_ctranslate2")
    before = bench.processes()
    # The spinner's shell exits at once: the spinner is no descendant of this process.
    cmd = ["sh", "-c", f'"{sys.executable}" -c "$0" &', SPIN]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as shell:
        assert shell.stdout is not None
        spinner = int(shell.stdout.readline())  # once it has spun
        try:
            began = time.process_time()
            while time.process_time() - began < 0.3:  # this process spins as well
                pass
            after = bench.processes()
        finally:
            os.kill(spinner, signal.SIGTERM)
    others = bench.others_cpu(before, after, os.getpid())
    assert others >= 0.25  # the spinner's 0.3 s, in whole ticks
    everyone = bench.others_cpu(before, after, -1)  # no process excluded
    assert everyone - others >= 0.25  # this process's 0.3 s


def test_quick_run_writes_the_table(tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="CTranslate2 is not installed (the compare extra)")
    int8 = [f"{SPEC}+int8"] if onednn.native("int8") else []  # AVX2 alone: no such engine
    chosen = [SPEC, *int8, "CTranslate2 int8_float32"]
    cmd = [sys.executable, str(REPO / "scripts/bench_ctranslate2.py"), "--quick", "--out", str(tmp_path), "--engines", *chosen]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "ct2.json").read_text())
    assert summary["sentences"] == 4 and summary["repeats"] == 1
    assert set(summary["results"]) == {"batch 1", "batch 16", "1,024 tokens"}
    for rows in summary["results"].values():
        assert list(rows) == [BASE, *chosen]
        assert rows[BASE]["identical_to_fairseq2"] == 4
        assert rows[SPEC]["identical_to_fairseq2"] == 4  # exact
        assert all(r["min_seconds"] > 0 for r in rows.values())
        assert all(r["others_cpu_seconds"] >= 0 and r["steal_seconds"] >= 0 for r in rows.values())  # fmt: skip
    table = (tmp_path / "ct2.md").read_text()
    assert all(f"| batch 1 | {engine} |" in table for engine in int8)
    assert "| batch 16 | CTranslate2 int8_float32 |" in table
    assert "exact to specbeam's own plain beam search on that quantized target" in table
    assert (tmp_path / "ct2.png").stat().st_size > 0
