"""Start-up errors: a bad setting ends an app with one line naming the setting and what
is allowed; a non-speculative decoding runs on a pair that has a draft."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator
from fairseq2.generation.sampling import SamplingSeq2SeqGenerator
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import OmegaConf

import specbeam.apps.calibrate  # noqa: F401  (registers calibrate_schema)
import specbeam.apps.distill  # noqa: F401  (registers distill_schema)
import specbeam.apps.evaluate  # noqa: F401  (registers evaluate_schema)
import specbeam.apps.train  # noqa: F401  (registers train_schema)
import specbeam.apps.train_head  # noqa: F401  (registers train_head_schema)
import specbeam.apps.translate  # noqa: F401  (registers translate_schema)
from specbeam.apps import app
from specbeam.apps.app import (
    PipelineConfig,
    check_group_choices,
    check_launcher,
    check_override_syntax,
    command_line_settings,
    run_app,
    shadowed_user_configs,
    unused_warning,
    value_problem,
)
from specbeam.apps.decoding import DecodingConfig, load_decoding
from specbeam.apps.hardware import HardwareConfig, load_hardware
from specbeam.apps.help import app_help
from specbeam.apps.translate import translate
from specbeam.data.inference import translate_texts
from specbeam.paths import SHIPPED, user_config_dir
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator

BASE = ["model=tiny_random", "hardware.threads=1"]
DECODINGS = ", ".join(sorted(p.stem for p in (SHIPPED / "conf" / "decoding").glob("*.yaml")))


def build_error(*overrides: str) -> str:
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose("translate", overrides=[*BASE, *overrides])
    with pytest.raises(SystemExit) as exit_info:
        run_app(lambda c: c.build(), cfg)
    message = str(exit_info.value.code)
    assert "\n" not in message and message.startswith("error: ")
    return message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["decoding.gamma=0"], "decoding.gamma=0 is invalid: must be ≥ 1"),
        (["decoding.gamma=-2"], "decoding.gamma=-2 is invalid: must be ≥ 1"),
        (["decoding=beam", "decoding.beam_size=0"], "decoding.beam_size=0 is invalid: must be ≥ 1"),
        (
            ["decoding.beam_size=5", "decoding.draft_width=3"],
            "decoding.draft_width=3 is invalid: must be ≥ beam_size (5)",
        ),
        (
            ["decoding.draft_strategy=wide"],
            "decoding.draft_strategy=wide is invalid: must be one of ('beam', 'linear', 'topm')",
        ),
        (["decoding.gamma_bounds=[3,2]"], "decoding.gamma_bounds=(3, 2) is invalid"),
        (
            ["decoding.gamma=4", "decoding.max_draft_nodes=2"],
            "decoding.max_draft_nodes=2 is invalid: must be ≥ gamma (4) or None",
        ),
        (["decoding=relaxed", "decoding.relax_gap=-1"], "decoding.relax_gap=-1.0 is invalid"),
        (
            ["decoding=relaxed", "decoding.max_speculative_batch=4"],
            "decoding.max_speculative_batch=4 is invalid: must be 0 with relaxed acceptance",
        ),
        (["decoding.max_speculative_batch=-1"], "decoding.max_speculative_batch=-1 is invalid"),
        (
            ["decoding.max_gen_len=[0,0]"],
            "decoding.max_gen_len=[0.0, 0.0] is invalid: must be [a, b] with a, b ≥ 0 and a ≥ 1 or b ≥ 1",
        ),
        (
            ["decoding=spec_sample", "decoding.sampler=greedy"],
            "decoding.sampler=greedy is invalid: allowed: top_p, top_k",
        ),
        (
            ["decoding=sample", "decoding.temperature=0"],
            "decoding.temperature=0.0 is invalid: must be > 0",
        ),
        (
            ["hardware.target_dtype=float16"],
            "hardware.target_dtype=float16 is invalid: allowed: float32, bfloat16, int8, auto",
        ),
        (
            ["hardware.memory_budget_mb=-1"],
            "hardware.memory_budget_mb=-1.0 is invalid: must be ≥ 0 (0 = unlimited)",
        ),
        (
            ["model.draft=null"],
            "decoding=spec_beam is speculative but model.draft is none: set model.draft, "
            "or use a non-speculative decoding (beam, greedy)",
        ),
        (
            ["model.draft=/nonexistent/draft.pt"],
            "model.draft=/nonexistent/draft.pt: checkpoint not found: /nonexistent/draft.pt",
        ),
    ],
)
def test_bad_setting_is_one_line(overrides: list[str], expected: str) -> None:
    assert expected in build_error(*overrides)


def test_non_speculative_decoding_leaves_the_draft_unloaded() -> None:
    """model.draft names a file that does not exist: beam search never opens it."""
    draft = ["model.draft=/nonexistent/draft.pt"]
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        beam = compose("translate", overrides=[*BASE, *draft, "decoding=beam"])
        spec = compose("translate", overrides=[*BASE, "decoding=spec_beam"])
    _, generator = run_app(lambda c: c.build(), beam)
    assert isinstance(generator, BeamSearchSeq2SeqGenerator)
    _, generator = run_app(lambda c: c.build(), spec)
    assert isinstance(generator, SpeculativeBeamSearchSeq2SeqGenerator)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["decoding=nope"], f"error: decoding=nope is unknown; allowed: {DECODINGS}"),
        (["task=wmt"], "error: task=wmt is unknown; allowed: bible_es_en"),
        (["hardware=gpu"], "error: hardware=gpu is unknown; allowed: cpu"),
        (["-m", "decoding=beam,spec_bean"], "error: decoding=spec_bean is unknown; allowed: beam,"),
        (["model=tiny"], "error: model=tiny is unknown; allowed: bible_es_en, tiny_random"),
    ],
)  # fmt: skip
def test_unknown_config_name_is_one_line(argv: list[str], expected: str) -> None:
    with pytest.raises(SystemExit) as exit_info:
        check_group_choices(argv)
    assert str(exit_info.value.code).startswith(expected)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["input=traducción (1).es"], "error: cannot read input=traducción (1).es (token recognition error at: 'ó'): a value with brackets, braces, '=', ':', ',' or non-ASCII letters must be quoted: \"input='traducción (1).es'\""),
        (["compare=beam:beam_size=4"], "error: cannot read compare=beam:beam_size=4 (mismatched input '=' expecting <EOF>): a value"),
        (["input=a,b.es"], "error: input=a,b.es gives input several values (the comma): add -m to run one job per value, or quote the value to read it as it is: \"input='a,b.es'\""),
    ],
)  # fmt: skip
def test_a_value_hydra_cannot_read_is_one_line_with_its_quoting(argv, expected) -> None:
    with pytest.raises(SystemExit) as exit_info:
        check_override_syntax(argv)
    assert str(exit_info.value.code).startswith(expected)


def test_quoted_values_lists_and_sweeps_under_m_pass() -> None:
    check_override_syntax(
        ["input='traducción (1).es'", "gammas=[1,2]", "-m", "decoding=beam,greedy", "--help",
         "input=my file.es", "compare='beam:beam_size=4'"]
    )  # fmt: skip


def test_known_names_and_other_overrides_pass() -> None:
    check_group_choices(
        ["decoding=beam,spec_beam", "decoding.gamma=3", "hydra/launcher=joblib", "+extra=1",
         "input=decoding=x", "hardware=cpu", "task=bible_es_en"]
    )  # fmt: skip


def test_unknown_decoding_ends_the_app_with_one_line(tmp_path) -> None:
    cmd = [sys.executable, "-m", "specbeam.translate", "decoding=nope", "model=tiny_random",
           f"hydra.run.dir={tmp_path}"]  # fmt: skip
    result = subprocess.run(cmd, cwd=SHIPPED, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines() == [
        f"error: decoding=nope is unknown; allowed: {DECODINGS} (looked in {SHIPPED}/conf/decoding, "
        f"{user_config_dir()}/decoding)"
    ]


@pytest.mark.parametrize(
    ("decoding", "kind"),
    [("sample", SamplingSeq2SeqGenerator), ("spec_sample", SpeculativeSamplingSeq2SeqGenerator)],
)
def test_sampling_decodings_are_reproducible_with_their_seed(decoding: str, kind: type) -> None:
    """The seed is set when the generator is built, so a rerun draws the same samples."""
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose(
            "translate", overrides=[*BASE, f"decoding={decoding}", "decoding.max_gen_len=[0.5,4]"]
        )
    runs = []
    for _ in range(2):
        tokenizer, generator = run_app(lambda c: c.build(), cfg)
        assert isinstance(generator, kind)
        texts = ["Hola mundo.", "Y dijo Dios."]
        runs.append(translate_texts(generator, tokenizer, texts, "spa_Latn", "eng_Latn"))
    assert runs[0] == runs[1]


def test_command_line_settings_win_over_calibrated_ones() -> None:
    """hardware.tuned fills in γ for spec_beam, unless decoding.gamma is on the command line."""
    hw = HardwareConfig(tuned={"spec_beam": {"gamma": 7, "draft_width": 9}})
    decoding = DecodingConfig(name="spec_beam", gamma=3)
    assert hw.tune(decoding).gamma == 7
    kept = hw.tune(decoding, keep={"gamma"})
    assert (kept.gamma, kept.draft_width) == (3, 9)
    assert command_line_settings("decoding") == set()  # outside a Hydra app


def test_a_setting_the_decoding_never_reads_is_a_warning(monkeypatch, capsys) -> None:
    """`decoding=beam decoding.gamma=3`: the setting is named, not passed silently."""
    monkeypatch.setattr(app, "command_line_settings", lambda group: {"gamma", "beam_size"})
    PipelineConfig(decoding=load_decoding("beam")).settle()
    assert capsys.readouterr().err == (
        "warning: decoding.gamma=4 has no effect: decoding=beam does not speculate\n"
    )
    PipelineConfig(decoding=load_decoding("spec_beam")).settle()
    assert capsys.readouterr().err == ""
    beam = load_decoding("beam")
    assert unused_warning(beam, {"top_p", "relax_top"}) == (
        "decoding.relax_top=0, decoding.top_p=0.9 have no effect: decoding=beam does not "
        "speculate or sample"
    )


def test_method_strings_are_tuned_but_for_the_settings_they_name() -> None:
    """evaluate's `spec_beam:draft_width=20` is spec_beam as tuned, with width 20."""
    hw = HardwareConfig(tuned={"spec_beam": {"gamma": 7, "draft_width": 9}})
    varied = hw.tune(load_decoding("spec_beam:draft_width=20;draft_prune_margin=1.5"))
    assert (varied.gamma, varied.draft_width, varied.draft_prune_margin) == (7, 20, 1.5)


@pytest.mark.parametrize(
    ("app", "overrides", "cpus"),
    [("translate", ["hardware.threads=6"], 6), ("evaluate", [], 2), ("train", ["threads=3"], 3)],
)
def test_slurm_jobs_ask_for_the_cpus_their_threads_use(
    app: str, overrides: list, cpus: int
) -> None:
    """conf/hydra/launcher/slurm.yaml: cpus_per_task follows the app's threads."""
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose(app, ["hydra/launcher=slurm", *overrides], return_hydra_config=True)
    assert instantiate(cfg.hydra.launcher).params["cpus_per_task"] == cpus


def test_configs_on_the_searchpath_are_known(tmp_path) -> None:
    (tmp_path / "hardware").mkdir()
    (tmp_path / "hardware/calibrated_here.yaml").write_text("name: calibrated_here\n")
    searchpath = f"hydra.searchpath=[file://{tmp_path}]"
    check_group_choices(["hardware=calibrated_here", searchpath])
    with pytest.raises(SystemExit) as exit_info:
        check_group_choices(["hardware=calibrated_here"])
    assert "allowed: cpu" in str(exit_info.value.code)


def run_entry(
    app: str, *argv: str, tmp_path: Path, env: dict | None = None
) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", f"specbeam.{app}", *argv, f"hydra.run.dir={tmp_path}"]
    return subprocess.run(
        cmd, cwd=SHIPPED, input="Hola\n", capture_output=True, text=True, timeout=300,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("app", "overrides", "run_dir"),
    [
        ("evaluate", ["output_dir=results"], "{cwd}/results"),
        ("evaluate", ["output_dir='~/results'"], "{home}/results"),
        ("calibrate", ["hardware_dir=hw"], "."),
        ("distill", ["out_dir=d"], "."),
    ],
)
def test_apps_write_no_run_directory_beside_their_output(
    app: str, overrides: list[str], run_dir: str, tmp_path: Path, monkeypatch
) -> None:
    """Not ./outputs/DATE/TIME/ in the working directory: evaluate's run directory (its
    config, its log) is its output_dir; calibrate and distill, like translate, have none."""
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose(app, overrides=overrides, return_hydra_config=True)
        hydra = cfg.hydra
        assert hydra.run.dir == run_dir.format(cwd=tmp_path, home=Path.home())
        assert (hydra.output_subdir is None) == (app != "evaluate")
        assert "file" not in hydra.job_logging.handlers or app == "evaluate"
        default = compose(app, return_hydra_config=True).hydra.run.dir
        assert default.startswith("outputs/") if app == "evaluate" else default == "."


def test_paths_are_relative_to_where_the_command_ran_with_job_chdir(tmp_path: Path) -> None:
    """hydra.job.chdir=true runs the job in its run directory; input=in.es still means the
    file beside the user, and output=out.en is written there (not in the run directory)."""
    (tmp_path / "in.es").write_text("Hola\n")
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "specbeam.translate", "model=tiny_random", "hardware.threads=1",
        "input=in.es", "output=out.en", "hydra.job.chdir=true", f"hydra.run.dir={run_dir}",
        "hydra.output_subdir=.hydra",
    ]  # fmt: skip
    result = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "out.en").read_text().splitlines()) == 1
    assert not (run_dir / "out.en").exists()
    assert (run_dir / ".hydra" / "config.yaml").exists()


@pytest.mark.parametrize(
    ("app", "override", "expected"),
    [
        ("translate", "decoding.gama=3", "decoding.gama is not a setting (did you mean decoding.gamma?)"),
        ("translate", "+ouput=x2.en", "ouput is not a setting (did you mean output?)"),
        ("calibrate", "+hardware.thread=1", "hardware.thread is not a setting (did you mean hardware.threads?)"),
        ("train_head", "hardware.threads=1", "hardware.threads is not a setting (did you mean threads?)"),
        ("translate", "hardware.threads=two", "hardware.threads=two is invalid: must be an integer"),
        ("translate", "nbest=1.5", "nbest=1.5 is invalid: must be an integer"),
        ("translate", "decoding.relax_gap=wide", "decoding.relax_gap=wide is invalid: must be a number"),
        ("translate", "decoding.plan=maybe", "decoding.plan=maybe is invalid: must be true or false"),
    ],
)  # fmt: skip
def test_a_misspelt_setting_is_one_line_naming_the_nearest(
    app: str, override: str, expected: str, tmp_path
) -> None:
    """Hydra would print six lines advising `+decoding.gama=3`, which then ran, ignored."""
    result = run_entry(app, "model=tiny_random", override, tmp_path=tmp_path)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [f"error: {expected}"]
    assert not (tmp_path / "x2.en").exists()


def test_keys_added_past_the_entry_check_are_refused_too() -> None:
    """Keys that reach the composed config past the command line's check (a config file,
    a caller composing it) get the same line from run_app."""
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose("translate", overrides=[*BASE, "+decoding.gama=3", "+hardware.tuned.x.y=1"])
    with pytest.raises(SystemExit) as exit_info:
        run_app(lambda c: c, cfg)
    assert (
        exit_info.value.code
        == "error: decoding.gama is not a setting (did you mean decoding.gamma?)"
    )
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose("translate", overrides=[*BASE, "+hardware.tuned.x.y=1"])  # a dict: any key
    assert run_app(lambda c: c.hardware.tuned, cfg) == {**load_hardware("cpu").tuned, "x": {"y": 1}}


def test_beam_size_is_checked_before_the_settings_compared_with_it() -> None:
    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose("translate", overrides=[*BASE, "decoding.beam_size=0"])
    with pytest.raises(SystemExit) as exit_info:
        run_app(translate, cfg)
    assert exit_info.value.code == "error: decoding.beam_size=0 is invalid: must be ≥ 1"


def test_ctrl_c_in_an_app_is_one_line_and_exit_code_130(capsys) -> None:
    def app(_: object) -> None:
        raise KeyboardInterrupt

    with initialize_config_dir(config_dir=str(SHIPPED / "conf"), version_base=None):
        cfg = compose("translate", overrides=BASE)
    with pytest.raises(SystemExit) as exit_info:
        run_app(app, cfg)
    assert exit_info.value.code == 130
    assert capsys.readouterr().err == "interrupted\n"


@pytest.mark.parametrize("app", ["translate", "evaluate", "train_head"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_code_130(app: str, tmp_path) -> None:
    cmd = [
        sys.executable,
        "-m",
        f"specbeam.{app}",
        "model=tiny_random",
        f"hydra.run.dir={tmp_path}",
    ]
    process = subprocess.Popen(
        cmd, cwd=SHIPPED, stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # startup.begin catches SIGTERM just after SIGINT (Python's own SIGINT handler, a
    # traceback, is there from the start): from then on, the imports are interrupted.
    _wait_for_handler(process.pid, signal.SIGTERM)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130
    assert stderr.strip().splitlines() == ["interrupted"]


def _wait_for_handler(pid: int, signum: int) -> None:
    """Until the process catches `signum` (its /proc status's SigCgt mask)."""
    bit = 1 << (signum - 1)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status").read_text()
        caught = int(
            next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1], 16
        )
        if caught & bit:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never caught signal {signum}")


def test_hardware_configs_of_the_user_directory_need_no_searchpath(tmp_path) -> None:
    """Where calibrate writes by default (`paths.user_config_dir`): every app finds it."""
    hardware = tmp_path / "config" / "specbeam" / "hardware"
    hardware.mkdir(parents=True)
    (hardware / "mine.yaml").write_text("name: mine\nthreads: 1\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = run_entry("translate", "model=tiny_random", "hardware=mine", "decoding.max_gen_len=[0.5,4]",
                       tmp_path=tmp_path, env=env)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1


def test_an_unknown_hardware_names_where_it_looked(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    (tmp_path / "specbeam" / "hardware").mkdir(parents=True)
    (tmp_path / "specbeam" / "hardware" / "mine.yaml").write_text("name: mine\n")
    check_group_choices(["hardware=mine"])
    with pytest.raises(SystemExit) as exit_info:
        check_group_choices(["hardware=my_nllb", f"hydra.searchpath=[file://{tmp_path}/w]"])
    assert exit_info.value.code == (
        f"error: hardware=my_nllb is unknown; allowed: cpu, mine (looked in {SHIPPED}/conf/hardware, "
        f"{tmp_path}/specbeam/hardware, {tmp_path}/w/hardware)"
    )


def test_a_user_config_a_shipped_one_hides_is_named(tmp_path, monkeypatch) -> None:
    """The shipped configs come first on the search path: a user's `hardware/cpu.yaml`
    is never read, which the user would not know without the warning."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    hardware = tmp_path / "specbeam" / "hardware"
    hardware.mkdir(parents=True)
    (hardware / "mine.yaml").write_text("name: mine\n")
    assert shadowed_user_configs() == []
    (hardware / "cpu.yaml").write_text("name: cpu\n")
    assert shadowed_user_configs() == [
        f"{hardware}/cpu.yaml is not used: hardware=cpu is a shipped config, which comes "
        "first; rename the file"
    ]


def test_a_tilde_in_the_searchpath_is_an_error_naming_the_full_path() -> None:
    """Hydra does not expand it: the config would not be found."""
    with pytest.raises(SystemExit) as exit_info:
        check_group_choices(["hardware=mine", "hydra.searchpath=[file://~/w]"])
    assert exit_info.value.code == (
        f"error: hydra.searchpath entry file://~/w: Hydra does not expand ~; write file://{Path.home()}/w"
    )


def test_help_lists_only_the_groups_an_app_can_pick() -> None:
    """train_head's task is a dataclass default, not a group of its defaults list:
    `task=NAME` would fail there, and no hardware group means no user directory line."""
    text = app_help("train_head", "Trains a head.", [])
    assert "Config groups" not in text and "\n  task:" not in text
    assert "where calibrate writes hardware configs" not in text
    translate_help = app_help("translate", "Translates.", [])
    assert "\n  task: bible_es_en*" in translate_help
    assert re.search(r"\n  hardware: .*\bcpu\*", translate_help)


def test_help_lists_the_app_s_own_groups_and_settings_with_descriptions(tmp_path) -> None:
    result = run_entry("translate", "--help", tmp_path=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.startswith(specbeam.apps.translate.__doc__.split("\n")[0])
    assert re.search(r"^  input=- +A file, or - : standard input", out, re.M)
    assert re.search(r"^  decoding: beam, .*spec_beam\*", out, re.M)
    # As the run uses them: hardware=cpu's calibration tunes spec_beam's γ and width.
    assert re.search(r"^  decoding.gamma=2 +\[hardware=cpu's calibration\] Draft depth", out, re.M)
    assert re.search(r"^  decoding.draft_width=10 +\[hardware=cpu's calibration\] Nodes", out, re.M)
    # A description longer than the line goes on over the next ones, none cut.
    assert re.search(
        r"^  output=- +A file \(through a symlink, its target\), written as .*\n {38}\S", out, re.M
    )
    assert not re.search(r"^  arch:", out, re.M)  # the training apps' group
    given = app_help("translate", None, ["decoding.gamma=3"])
    assert re.search(r"^  decoding.gamma=3 +Draft depth", given, re.M)  # the command line's wins
    calibrate_help = app_help("calibrate", None, ["hardware.threads=1"])
    assert re.search(r"^  hardware.threads=1", calibrate_help, re.M)
    assert re.search(
        r"^  hardware_dir=null +None: the per-user hardware configs", calibrate_help, re.M
    )
    assert "decoding:" not in calibrate_help


def test_a_value_is_checked_as_the_setting_will_convert_it() -> None:
    """Quoted, a number is a string Hydra hands on and the setting converts; sweeps,
    interpolations and null are Hydra's to parse."""
    threads = OmegaConf.structured(HardwareConfig)._get_node("threads")
    assert value_problem(threads, "two") == "must be an integer"
    for fine in ("2", "'2'", '"2"', "1,2", "${oc.env:THREADS}", "null", "range(1,3)"):
        assert value_problem(threads, fine) is None, fine


def test_a_slurm_multirun_without_slurm_is_one_line(monkeypatch) -> None:
    """submitit fails with a traceback once the config is composed; --cfg only prints it."""
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(SystemExit) as exit_info:
        check_launcher(["-m", "hydra/launcher=slurm", "shard=0/2,1/2"])
    assert str(exit_info.value.code).startswith(
        "error: hydra/launcher=slurm submits jobs with SLURM's sbatch"
    )
    check_launcher(["-m", "hydra/launcher=slurm", "--cfg", "hydra"])
    check_launcher(["hydra/launcher=slurm"])


def test_slurm_sweep_over_threads_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """submitit's executor takes cpus_per_task once per sweep, resolved from the config
    without the sweep's values: threads 4,8 would run both jobs on the default's CPUs."""
    sbatch = tmp_path / "sbatch"
    sbatch.write_text("#!/bin/sh\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    for swept in ("hardware.threads=4,8", "threads=range(2,9,2)", "hardware.threads=choice(4,8)"):
        with pytest.raises(SystemExit) as exit_info:
            check_launcher(["-m", "hydra/launcher=slurm", swept])
        assert str(exit_info.value.code).startswith(f"error: {swept} sweeps the thread count")
    check_launcher(["-m", "hydra/launcher=slurm", "hardware.threads=8", "shard=0/2,1/2"])
    check_launcher(
        ["-m", "hydra/launcher=slurm", "hardware.threads=4,8", "hydra.launcher.cpus_per_task=8"]
    )
    check_launcher(["-m", "hydra/launcher=joblib", "hardware.threads=1,2"])
