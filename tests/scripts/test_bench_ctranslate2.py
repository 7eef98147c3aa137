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
    every = bench.engines(["float32", "bfloat16", "int8"], ["default", "DNNL AVX512"])
    ct2 = [f"CTranslate2 {t} {v}" for t in ("float32", "int8_float32") for v in ("default", "DNNL AVX512")]  # fmt: skip
    assert every == [BASE, SPEC, f"{SPEC}+bfloat16", f"{SPEC}+int8", *ct2]
    assert bench.engines(["float32"], ["default"]) == [
        BASE, SPEC, "CTranslate2 float32 default", "CTranslate2 int8_float32 default",
    ]  # fmt: skip
    greedy = bench.engines(["float32"], ["default"], "greedy")
    assert greedy[:2] == ["fairseq2 greedy", "specbeam spec_greedy"]
    assert bench.choose(every, None) == every
    assert bench.choose(every, [SPEC]) == [BASE, SPEC]  # a whole name: that engine alone
    assert bench.choose(every, ["int8"]) == [BASE, f"{SPEC}+int8", *ct2[2:]]
    assert bench.choose(greedy, [greedy[2]]) == ["fairseq2 greedy", "CTranslate2 float32 default"]
    with pytest.raises(SystemExit, match="--engines fp16: no such engine here"):
        bench.choose(every, ["int8", "fp16"])


def test_every_backend_and_isa_is_a_variant_and_sets_its_variables(script) -> None:
    bench = script("bench_ctranslate2")
    assert bench.variants(avx512=False) == ["default", "MKL packed AVX2", "MKL AVX2", "DNNL AVX2"]
    assert len(bench.variants(avx512=True)) == 7
    assert bench.ct2_env("CTranslate2 float32 default") == {}
    assert bench.ct2_env("CTranslate2 int8_float32 DNNL AVX512") == {
        "CT2_USE_MKL": "0", "CT2_FORCE_CPU_ISA": "AVX512",
    }  # fmt: skip
    assert bench.ct2_env("CTranslate2 float32 MKL packed AVX2") == {
        "CT2_USE_MKL": "1", "CT2_PACKED_GEMM": "1", "CT2_FORCE_CPU_ISA": "AVX2",
    }  # fmt: skip


def test_a_ct2_variable_it_does_not_read_is_refused(script) -> None:
    check = script("bench_ctranslate2").check_ct2_env
    check({"CT2_USE_MKL": "0", "CT2_FORCE_CPU_ISA": "AVX512", "PATH": "/bin"})
    with pytest.raises(SystemExit, match="CT2_USE_EXPERIMENTAL_PACKED_GEMM: not a CTranslate2"):
        check({"CT2_USE_EXPERIMENTAL_PACKED_GEMM": "0"})


LOG = """[2026-12-08 00:36:40.789] [ctranslate2] [thread 1] [info] CPU: AuthenticAMD (AVX512=true)
[2026-12-08 00:36:40.789] [ctranslate2] [thread 1] [info]  - Selected ISA: AVX512
[2026-12-08 00:36:40.789] [ctranslate2] [thread 1] [info]  - Use Intel MKL: false
[2026-12-08 00:36:40.789] [ctranslate2] [thread 1] [info]  - SGEMM backend: DNNL (packed: false)
[2026-12-08 00:36:40.789] [ctranslate2] [thread 1] [info]  - GEMM_S8 backend: DNNL (packed: false, u8s8 preferred: true)
"""


def test_the_log_names_what_ctranslate2_ran_on(script) -> None:
    ct2_log = script("bench_ctranslate2").ct2_log
    assert ct2_log(LOG) == "ISA AVX512, fp32 DNNL, int8 DNNL"
    assert (
        ct2_log(LOG.replace("DNNL (packed: false", "MKL (packed: true"))
        == "ISA AVX512, fp32 MKL packed, int8 MKL packed"
    )


def test_the_timed_rows_keep_each_types_default_and_its_fastest(script) -> None:
    bench = script("bench_ctranslate2")
    f32, i8 = "CTranslate2 float32", "CTranslate2 int8_float32"
    dnnl, mkl = "ISA AVX2, fp32 DNNL, int8 DNNL", "ISA AVX2, fp32 MKL, int8 MKL"
    probed = {
        f"{f32} default": {"batch 1": 3.0, "1,024 tokens": 1.0, "backend": dnnl},
        f"{f32} DNNL AVX512": {"batch 1": 2.0, "1,024 tokens": 1.5, "backend": "ISA AVX512"},
        f"{f32} MKL AVX2": {"batch 1": 9.0, "1,024 tokens": 2.0, "backend": mkl},
        f"{i8} default": {"batch 1": 1.1, "1,024 tokens": 1.0, "backend": dnnl},
        f"{i8} DNNL AVX2": {"batch 1": 1.0, "1,024 tokens": 1.0, "backend": dnnl},  # the default
        f"{i8} MKL AVX2": {"batch 1": 2.0, "1,024 tokens": 2.0, "backend": mkl},
    }
    chosen = [BASE, SPEC, *probed]
    assert bench.best_variants(chosen, probed) == [
        BASE, SPEC, f"{f32} default", f"{f32} DNNL AVX512", f"{i8} default",
    ]  # fmt: skip


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
    chosen = [SPEC, *int8, "CTranslate2 int8_float32 default", "CTranslate2 int8_float32 DNNL AVX2"]  # fmt: skip
    cmd = [sys.executable, str(REPO / "scripts/bench_ctranslate2.py"), "--quick", "--out", str(tmp_path), "--ct2-all", "--engines", *chosen]  # fmt: skip
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
    assert (
        "| batch 16 | CTranslate2 int8_float32 DNNL AVX2 | ISA AVX2, fp32 DNNL, int8 DNNL |"
        in table
    )
    assert "exact to specbeam's own plain search on that quantized target" in table
    assert (tmp_path / "ct2.png").stat().st_size > 0
