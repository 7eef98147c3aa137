"""The documented SLURM scale-out on a real one-node cluster (`slurm_cluster`): translate's
shard sweep through `hydra/launcher=slurm` (hydra-submitit-launcher), one of whose two array
tasks is preempted midway, requeued and resumed from its shard's partial file, merged by
`specbeam.merge_shards`, equals one local job's output byte for byte. Skipped, with the
reason, where the cluster cannot run (not root, Debian's packages not installed, a daemon
that cannot start here)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specbeam.apps.merge_shards import main as merge_shards
from tests.apps import slurm_cluster
from tests.apps.slurm_cluster import Cluster

REPO = Path(__file__).resolve().parents[2]
LINES = 24
"""Input lines: two shards of 12, three chunks each."""
CHUNK = 4
SETTINGS = ["hardware.threads=1", f"chunk_lines={CHUNK}"]
"""The local job's and every shard's: chunks cut at the same lines, so the same batches."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    reason = slurm_cluster.missing()
    if reason is not None:
        pytest.skip(f"no SLURM cluster: {reason}")
    try:
        running = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except slurm_cluster.NotStarted as error:
        pytest.skip(f"no SLURM cluster: {error}")
    yield running
    running.stop()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded task's first test sentences, and one local job's translation beside."""
    rows = (REPO / "tasks/bible_es_en/data/test.tsv").read_text(encoding="utf-8").splitlines()
    source = tmp_path_factory.mktemp("corpus") / "src.es"
    source.write_text("".join(row.split("\t")[1] + "\n" for row in rows[:LINES]), "utf-8")
    cmd = [sys.executable, "-m", "specbeam.translate", *SETTINGS, f"input={source}",
           f"output={source.with_name('local.en')}"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return source


@dataclass
class Sweep:
    """A finished sweep: its shards' outputs beside `out`, its files in `dir`."""

    out: Path
    dir: Path
    preempted: str
    """The array task preempted midway (SLURM's `JOB_TASK`)."""
    accounting: list[str]
    """sacct's lines of the array job, every run of a requeued task included."""


@pytest.fixture(scope="module")
def sweep(cluster: Cluster, corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Sweep:
    """usage.md's SLURM sweep over two shards, small enough for this machine, whose shard
    1/2 is preempted after its first chunk as submitit's own test of preemption does it
    (SIGTERM, then the SIGUSR2 the preset asks for): submitit requeues the task, which runs
    again. (A job's limit is 20 minutes: submitit takes a SIGUSR2 within 10 minutes of the
    limit, or after 80% of it, for a time-out, which a job of 10 minutes always is.)"""
    out = tmp_path_factory.mktemp("sweep") / "out.en"
    cmd = [sys.executable, "-m", "specbeam.translate", "-m", "hydra/launcher=slurm",
           "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=20",
           "hydra.launcher.mem_gb=1", *SETTINGS, "shard=0/2,1/2", f"input={corpus}",
           f"output={out}", f"hydra.sweep.dir={out.parent / 'sweep'}"]  # fmt: skip
    run = subprocess.Popen(
        cmd, cwd=REPO, env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    submitit = out.parent / "sweep/.submitit"
    partial = out.parent / "out.en.shard-1-of-2.partial"
    try:
        deadline = time.monotonic() + 180
        while not (partial.exists() and partial.read_bytes().count(b"\n") >= CHUNK):
            if time.monotonic() > deadline or run.poll() is not None:
                raise AssertionError(f"shard 1/2 wrote no chunk\n{cluster.logs()}")
            time.sleep(0.05)
        (task,) = [p.name for p in submitit.glob("*_1")]
        cluster.run("scancel", "--signal=TERM", task)
        cluster.run("scancel", "--signal=USR2", task)
        output, _ = run.communicate(timeout=240)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, f"{output}\n{cluster.logs()}"
    table = finished_accounting(cluster, task.split("_")[0])
    print(cluster.run("sinfo"), *table, sep="\n")  # for a report: pytest -s
    return Sweep(out, submitit.parent, task, table)


def finished_accounting(cluster: Cluster, job: str) -> list[str]:
    """sacct's lines of `job` once it records every run as ended (slurmctld tells slurmdbd
    after the job's end, which submitit saw in its result files)."""
    fields = "--format=JobID,JobName%20,Partition,AllocCPUS,State,ExitCode,Elapsed,NodeList"
    deadline = time.monotonic() + 30
    while True:
        table = cluster.run("sacct", "--duplicates", "--allocations", "-j", job, fields)
        ended = not {"PENDING", "RUNNING", "COMPLETING"} & set(table.split())
        if ended or time.monotonic() > deadline:
            return table.splitlines()
        time.sleep(0.5)


def test_a_shard_sweep_on_slurm_equals_one_local_job(sweep: Sweep, corpus: Path, capsys) -> None:
    merge_shards(["--input", str(corpus), "--output", str(sweep.out)])
    assert capsys.readouterr().err == f"wrote {sweep.out}: {LINES} lines from 2 shards\n"
    assert sweep.out.read_bytes() == corpus.with_name("local.en").read_bytes()


def test_a_preempted_shard_resumes_from_its_partial_file(sweep: Sweep) -> None:
    """The requeued task decodes only the chunks its partial file lacks."""
    log = (sweep.dir / ".submitit" / sweep.preempted / f"{sweep.preempted}_0_log.err").read_text()
    assert "Caught signal SIGUSR2 on" in log and "this job is preempted" in log
    assert f"Requeued job {sweep.preempted}" in log
    resumed = re.findall(r"resuming \S+ after line (\d+)", log)
    assert len(resumed) == 1 and CHUNK <= int(resumed[0]) < LINES // 2, resumed
    job = sweep.preempted.split("_")[0]
    states = sorted((row.split()[0], row.split()[4]) for row in sweep.accounting[2:])
    expected = [(f"{job}_0", "COMPLETED"), (f"{job}_1", "COMPLETED"), (f"{job}_1", "REQUEUED")]
    assert states == expected, sweep.accounting
