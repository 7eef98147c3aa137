"""Distillation data: sharded, resumable chunks that merge back in order."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from specbeam import startup
from specbeam.apps.distill import DistillConfig, distill, origin
from specbeam.data.pairs import read_tsv
from specbeam.data.task import TaskConfig
from specbeam.paths import SHIPPED

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "specbeam.distill", "model=tiny_random", "hardware.threads=1",
           f"task.data_dir={tmp_path}/data", f"out_dir={tmp_path}/out", "chunk_size=2",
           "decoding.max_gen_len=[0.5,3]", f"hydra.run.dir={tmp_path}/hydra", *overrides]  # fmt: skip
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)


def test_shards_resume_and_merge_in_order(tmp_path) -> None:
    (tmp_path / "data").mkdir()
    rows = [f"Ref {i}\tY dijo {i} veces.\tAnd he said it {i} times." for i in range(5)]
    (tmp_path / "data" / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")

    first = run(tmp_path, "shard=0/2")
    assert first.returncode == 0, first.stderr
    chunks = sorted(p.name for p in (tmp_path / "out" / "chunks").glob("*.tsv"))
    assert chunks == ["00000.tsv", "00002.tsv"]  # shard 0 of 2 owns chunks 0 and 2
    assert not (tmp_path / "out" / "train.tsv").exists()

    stamp = (tmp_path / "out" / "chunks" / "00000.tsv").stat().st_mtime_ns
    second = run(tmp_path, "shard=1/2")
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "out" / "chunks" / "00000.tsv").stat().st_mtime_ns == stamp  # not redone
    merged = read_tsv(tmp_path / "out" / "train.tsv")
    assert [p.ref for p in merged] == [f"Ref {i}" for i in range(5)]
    assert [p.source for p in merged] == [f"Y dijo {i} veces." for i in range(5)]

    bad = run(tmp_path, "shard=3/2")
    assert bad.returncode != 0 and "shard=3/2 is invalid" in bad.stderr


def test_chunks_of_another_target_or_task_are_refused(tmp_path) -> None:
    """Chunks resume by file name: another distillation's out_dir must not be merged."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("r\tY dijo.\tAnd he said.\n", encoding="utf-8")
    first = run(tmp_path)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "out" / "chunks" / "origin.json").exists()
    other = run(tmp_path, "merge_only=true", "task.tgt_lang=spa_Latn")
    assert other.returncode != 0
    assert other.stderr.strip().splitlines()[-1] == (
        f"error: out_dir={tmp_path}/out holds chunks of another distillation: tgt_lang "
        "eng_Latn (not spa_Latn); give another out_dir, or remove that one"
    )


def test_merge_only_with_chunks_missing_is_an_error(tmp_path) -> None:
    """A script's next step (train_head) must not read a missing or stale train.tsv."""
    (tmp_path / "data").mkdir()
    rows = [f"r{i}\tY dijo {i}.\tAnd he said {i}.\n" for i in range(3)]
    (tmp_path / "data" / "train.tsv").write_text("".join(rows), encoding="utf-8")
    merged = run(tmp_path, "merge_only=true")
    assert merged.returncode != 0
    assert merged.stderr.strip().splitlines()[-1] == (
        f"error: merge_only=true: 2 of 2 chunks are missing from {tmp_path}/out/chunks; make "
        "them first with the same settings and no merge_only (`python -m specbeam.distill … "
        "shard=i/n` for each shard)"
    )
    assert not (tmp_path / "out" / "train.tsv").exists()


def test_chunks_of_other_data_or_another_decoding_are_refused(tmp_path) -> None:
    """A split edited between two shards' runs moves every later chunk's pairs; another
    decoding makes other targets: either merged in would be wrong data, silently."""
    (tmp_path / "data").mkdir()
    rows = [f"r{i}\tY dijo {i}.\tAnd he said {i}.\n" for i in range(4)]
    (tmp_path / "data" / "train.tsv").write_text("".join(rows), encoding="utf-8")
    first = run(tmp_path, "shard=0/2")
    assert first.returncode == 0, first.stderr
    (tmp_path / "data" / "train.tsv").write_text("".join(["r9\tHola.\tHello.\n", *rows]))
    edited = run(tmp_path, "shard=1/2")
    assert edited.returncode != 0
    assert "holds chunks of another distillation: sources 4 pairs, sha256 " in edited.stderr
    (tmp_path / "data" / "train.tsv").write_text("".join(rows), encoding="utf-8")
    greedy = run(tmp_path, "shard=1/2", "decoding=greedy")
    assert greedy.returncode != 0
    assert "decoding.name spec_beam (not greedy)" in greedy.stderr


def test_an_empty_split_or_a_chunk_size_below_one_is_refused(tmp_path) -> None:
    (tmp_path / "train.tsv").write_text("")
    task = TaskConfig(data_dir=str(tmp_path))
    out = str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"^chunk_size=0 is invalid: must be ≥ 1$"):
        distill(DistillConfig(task=task, out_dir=out, chunk_size=0))
    with pytest.raises(ValueError, match=rf"^split 'train' in task.data_dir={tmp_path} holds no pairs$"):  # fmt: skip
        distill(DistillConfig(task=task, out_dir=out))
    assert not (tmp_path / "out").exists()


def test_limit_distills_the_first_pairs(tmp_path, monkeypatch) -> None:
    """A trial of the chain on a few pairs; a negative limit is refused before any work."""
    (tmp_path / "data").mkdir()
    rows = [f"Ref {i}\tY dijo {i} veces.\tAnd he said it {i} times." for i in range(5)]
    (tmp_path / "data" / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    task, out = TaskConfig(data_dir=str(tmp_path / "data")), str(tmp_path / "out")
    with pytest.raises(ValueError, match=r"^limit=-1 is invalid: must be ≥ 0 \(0: all\)$"):
        distill(DistillConfig(task=task, out_dir=out, limit=-1))
    translated = []

    def translate(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        translated.extend(args[2])
        return ["x" for _ in args[2]]

    monkeypatch.setattr("specbeam.apps.distill.translate_texts", translate)
    monkeypatch.setattr(DistillConfig, "build", lambda self: (None, None))
    distill(DistillConfig(task=task, out_dir=out, limit=3, chunk_size=2))
    assert translated == [f"Y dijo {i} veces." for i in range(3)]
    assert len(read_tsv(tmp_path / "out" / "train.tsv")) == 3


def test_sigterm_says_how_many_chunks_are_kept(tmp_path, monkeypatch, capsys) -> None:
    """A scheduler's SIGTERM mid-run: one line with the chunks written, exit code 143; the
    finished chunk stays, and the rerun translates only the rest."""
    (tmp_path / "data").mkdir()
    rows = [f"Ref {i}\tY dijo {i} veces.\tAnd he said it {i} times." for i in range(5)]
    (tmp_path / "data" / "train.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        composed = compose("distill", overrides=[
            "model=tiny_random", "hardware.threads=1", f"task.data_dir={tmp_path}/data",
            f"out_dir={tmp_path}/out", "chunk_size=2", "decoding.max_gen_len=[0.5,3]",
        ])  # fmt: skip
    calls = []
    stop_at = [2]  # the call that a SIGTERM interrupts; none in the rerun

    def translate_then_stop(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(args[2])
        if len(calls) in stop_at:
            raise startup.Terminated
        return ["x" for _ in args[2]]

    monkeypatch.setattr("specbeam.apps.distill.translate_texts", translate_then_stop)
    with pytest.raises(SystemExit) as exit_info:
        distill(OmegaConf.to_object(composed))
    assert exit_info.value.code == 143
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"terminated: 1 of this run's 3 chunks (shard 0/1) are in {tmp_path}/out/chunks; "
        "run the same command again to continue"
    )
    assert sorted(p.name for p in (tmp_path / "out" / "chunks").glob("*.tsv")) == ["00000.tsv"]
    calls.clear()
    stop_at.clear()
    distill(OmegaConf.to_object(composed))  # a rerun: a new process's config
    assert calls == [[f"Y dijo {i} veces." for i in (2, 3)], ["Y dijo 4 veces."]]
    assert len(read_tsv(tmp_path / "out" / "train.tsv")) == 5


def test_the_origin_records_the_precision_and_decoding_as_run(tmp_path) -> None:
    """target_dtype=auto is another precision on another CPU, and a machine's calibration
    another draft tree: chunks made under either must not pass for this run's."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.tsv").write_text("r\tY dijo.\tAnd he said.\n", encoding="utf-8")
    cfg = DistillConfig(task=TaskConfig(data_dir=str(tmp_path / "data")))
    cfg.hardware.target_dtype = "auto"
    cfg.hardware.tuned = {"spec_beam": {"gamma": 3}}
    found = origin(cfg, cfg.task.split("train"))
    assert found["target_dtype"] == cfg.hardware.target_precision != "auto"
    assert found["decoding.gamma"] == 3
    assert "data_dir" not in found  # another path on each install; `sources` names the data
