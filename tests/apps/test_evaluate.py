"""The comparison app: a side-by-side run writes its Markdown table, JSON, CSV and plots."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from specbeam.apps.compare import MethodRun
from specbeam.apps.decoding import load_decoding
from specbeam.apps.evaluate import EvaluateConfig, evaluate, markdown, plot, summarise
from specbeam.data.task import TaskConfig
from specbeam.search.stats import SpecStats

REPO = Path(__file__).resolve().parents[2]


def test_evaluate_side_by_side(tmp_path) -> None:
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "specbeam.evaluate", "model=tiny_random", "hardware.threads=1", "limit=3",
           'methods=[beam,"spec_beam:plan=false",greedy,"spec_greedy:plan=false"]', "batch_sizes=[1,2]",
           f"output_dir={out}",
           f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    # plan=false: speculation at batch 2 is what this test exercises, whatever the planner says.
    assert (
        "| spec_beam:plan=false | beam | 1 |" in result.stdout and "BLEU: nrefs:1" in result.stdout
    )
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert len(rows) == 8
    by_name = {(r["method"], r["batch_size"]): r for r in rows}
    for batch in (1, 2):
        assert by_name[("spec_beam:plan=false", batch)]["exact_match"] == 1.0  # exact mode
        assert by_name[("spec_greedy:plan=false", batch)]["exact_match"] == 1.0
        assert by_name[("spec_beam:plan=false", batch)]["baseline"] == "beam"
        assert by_name[("spec_greedy:plan=false", batch)]["baseline"] == "greedy"
        assert by_name[("beam", batch)]["speedup"] == 1.0
        assert by_name[("spec_beam:plan=false", batch)]["target_passes_per_sentence"] > 0
    assert (out / "results.csv").read_text().count("\n") == 9
    table = (out / "results.md").read_text()  # the table printed, as a file beside the others
    assert table.startswith("| method | vs |") and table in result.stdout
    assert table.count("\n| spec_beam:plan=false | beam |") == 2
    assert (out / "speedup_tau.png").stat().st_size > 0 and (
        out / "throughput.png"
    ).stat().st_size > 0


def test_a_method_its_planner_ran_plain_on_every_sentence_is_all_plain(tmp_path) -> None:
    """It made no passes: 100% plain, and no τ (the table's –, no bar in the plot), not τ 1
    as if it speculated; a plain method's τ is 1 and its plain share –."""
    refs = ["in the beginning", "and the earth"]

    def ran(name: str, stats: SpecStats) -> MethodRun:
        run = MethodRun(name, generator=None, seconds=[0.5, 0.5], outputs=refs)  # type: ignore[arg-type]
        run.tokens, run.stats = [[[4, 5]], [[6]]], stats
        return run

    runs = [ran("beam", SpecStats()), ran("spec_beam", SpecStats(plain_sources=2))]
    rows = summarise(runs, [load_decoding("beam"), load_decoding("spec_beam")], refs, 1, 2)
    assert (rows[1]["plain_share"], rows[1]["tau"]) == (1.0, None)
    assert (rows[0]["plain_share"], rows[0]["tau"]) == (None, 1.0)
    lines = markdown(rows).splitlines()
    assert "| 1.00× | 100% | – | – | – |" in lines[3] and "| 1.00× | – | 1.00 | – | – |" in lines[2]
    plot(rows, tmp_path)
    assert (tmp_path / "speedup_tau.png").stat().st_size > 0


def test_slurm_launcher_config_composes() -> None:
    """The documented cluster preset resolves to submitit's SLURM launcher (not launched)."""
    cmd = [
        sys.executable,
        "-m",
        "specbeam.evaluate",
        "hydra/launcher=slurm",
        "hydra.launcher.partition=cpu",
        "--cfg",
        "hydra",
    ]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "hydra_submitit_launcher.submitit_launcher.SlurmLauncher" in result.stdout
    assert "partition: cpu" in result.stdout
    # The CPUs follow the threads (resolved: tests/apps/test_app.py).
    assert "cpus_per_task: ${oc.select:hardware.threads" in result.stdout


def test_evaluate_the_embedded_pair(tmp_path) -> None:
    """The default task and pair: exact speculative beam search matches beam search, as
    configured (the planner may run it plain) and always speculating."""
    out = tmp_path / "eval"
    cmd = [sys.executable, "-m", "specbeam.evaluate", "hardware.threads=1", "every=300", "limit=4",
           'methods=[beam,spec_beam,"spec_beam:plan=false"]', f"output_dir={out}",
           f"hydra.run.dir={tmp_path}/hydra"]  # fmt: skip
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {r["method"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    always = rows["spec_beam:plan=false"]
    assert rows["spec_beam"]["exact_match"] == always["exact_match"] == 1.0
    assert always["tau"] > 1.0
    assert rows["beam"]["bleu"] == rows["spec_beam"]["bleu"] == always["bleu"] > 10


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"every": 0}, "every=0 is invalid: must be ≥ 1"),
        ({"limit": -1}, "limit=-1 is invalid: must be ≥ 0 (0: all)"),
        ({"batch_sizes": [1, 0]}, "batch_sizes=[1, 0] is invalid: each must be ≥ 1"),
        ({"batch_sizes": []}, "batch_sizes=[] is invalid: each must be ≥ 1"),
        ({"methods": []}, "methods=[] is invalid: name one or more decodings, each once"),
        (
            {"methods": ["beam", "beam"]},
            "methods=['beam', 'beam'] is invalid: name one or more decodings, each once",
        ),
    ],
)
def test_bad_settings_are_one_line_errors_before_any_work(settings: dict, expected: str) -> None:
    with pytest.raises(ValueError) as error:
        EvaluateConfig(**settings).check()
    assert str(error.value) == expected


def test_a_results_directory_that_is_a_file_is_refused_before_the_run(tmp_path) -> None:
    """It was found after the whole evaluation, whose results were then lost."""
    taken = tmp_path / "results"
    taken.write_text("")
    with pytest.raises(ValueError) as error:
        EvaluateConfig(output_dir=str(taken)).check()
    assert str(error.value) == f"output_dir={taken} is a file: give a directory"
    EvaluateConfig(output_dir=str(tmp_path / "new" / "dir")).check()
    assert (tmp_path / "new" / "dir").is_dir()


def test_an_empty_split_is_named_before_the_models_load(tmp_path) -> None:
    """sacrebleu failed on it with an IndexError after the whole run."""
    (tmp_path / "test.tsv").write_text("")
    cfg = EvaluateConfig(task=TaskConfig(data_dir=str(tmp_path)), output_dir=str(tmp_path / "r"))
    with pytest.raises(ValueError) as error:
        evaluate(cfg)
    assert str(error.value) == f"split 'test' in task.data_dir={tmp_path} holds no pairs"
