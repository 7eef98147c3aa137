"""specbeam as users install it: the wheel, in a fresh virtualenv, run from another directory.

The virtualenv reuses this environment's dependencies (a `.pth` file naming its
site-packages), so the test needs no network; the wheel's own files (package, shipped
configs, the embedded pair) are the only specbeam the run can see.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "specbeam", "conf", "tasks")


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kwargs)
    assert result.returncode == 0, f"{' '.join(map(str, cmd))}\n{result.stderr[-3000:]}"
    return result


def build_wheel(tmp_path: Path) -> Path:
    """Built from a copy, so the build leaves no `build/` or egg-info in the checkout, by
    this environment's setuptools (no build isolation: no network)."""
    import setuptools

    major = int(setuptools.__version__.split(".")[0])
    assert major >= 77, (
        "pyproject.toml needs setuptools>=77 (the [test] extra): run scripts/setup.sh"
    )
    src = tmp_path / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "train.tsv", "*.png")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip"]
    run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", wheels, src])
    (wheel,) = wheels.glob("specbeam-*.whl")
    return wheel


def install(wheel: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A virtualenv holding the wheel, and the environment to run it in: fairseq2n finds
    its native libraries (oneTBB) next to its site-packages, so they go on the loader's
    path."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    site = Path(purelib.stdout.strip())
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "test-deps.pth").write_text("\n".join(deps) + "\n")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            "--target",
            site,
            wheel,
        ]
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    libs = [str(Path(p).parents[1]) for p in deps]
    env["LD_LIBRARY_PATH"] = os.pathsep.join([*libs, env.get("LD_LIBRARY_PATH", "")])
    return python, env


def test_installed_wheel_translates_from_another_directory(tmp_path) -> None:
    wheel = build_wheel(tmp_path)
    python, env = install(wheel, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    found = run([python, "-c", "import importlib.util as u; print(u.find_spec('specbeam').origin)"], cwd=work, env=env)  # fmt: skip
    assert Path(found.stdout.strip()).is_relative_to(tmp_path / "venv")

    lines = (REPO / "tasks/bible_es_en/examples.es").read_text(encoding="utf-8").splitlines()
    (work / "in.es").write_text("\n".join(lines[:2]) + "\n", encoding="utf-8")
    cmd = [python, "-m", "specbeam.translate", "input=in.es", "output=out.en", "hardware.threads=1"]  # fmt: skip
    run(cmd, cwd=work, env=env)
    assert (work / "out.en").read_text(encoding="utf-8").splitlines() == [
        "In the beginning God created the heaven and earth.",
        "And Elimelech died, the husband of Not, and she abode with her two sons:",
    ]
    # The shards' merge (docs/usage.md, "Shards") is in the wheel too: one shard of one.
    merge = [python, "-m", "specbeam.merge_shards", "--input", "in.es", "--output", "joined.en", "out.en"]  # fmt: skip
    run(merge, cwd=work, env=env)
    assert (work / "joined.en").read_bytes() == (work / "out.en").read_bytes()
