"""Draws training histories side by side: dev BLEU and training loss per epoch for
`python -m specbeam.train` runs, held-out coverage per step and drafting depth for
`python -m specbeam.train_head` runs (the target's top 5 within the head's top 10).

python scripts/plot_training.py --out curves.png target=~/.cache/specbeam/target draft=~/.cache/specbeam/draft
python scripts/plot_training.py --out heads.png last=~/.cache/specbeam/head_ctl layers=~/.cache/specbeam/head_l13
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402


def _model_run(label: str, history: list[dict], axes: tuple[Axes, Axes]) -> None:
    epochs = [h["epoch"] for h in history]
    axes[0].plot(epochs, [h["dev_bleu_greedy"] for h in history], "o-", label=label)
    axes[1].plot(epochs, [h["train_loss"] for h in history], "o-", label=label)
    axes[0].set(xlabel="epoch", ylabel="dev BLEU (greedy)")
    axes[1].set(xlabel="epoch", ylabel="training loss (label-smoothed)")


def _head_run(label: str, history: list[dict], axes: tuple[Axes, Axes]) -> None:
    steps = [h["step"] for h in history]
    for depth, ax in enumerate(axes):
        ax.plot(steps, [h["valid"][depth]["top5_in_10"] for h in history], "o-", label=label)
        ax.set(xlabel="step", ylabel=f"target's top 5 in head's top 10, depth {depth + 1}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("runs", nargs="+", help="label=training output directory")
    args = parser.parse_args(argv)
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for run in args.runs:
        label, _, folder = run.partition("=")
        history = json.loads((Path(folder).expanduser() / "history.json").read_text())
        draw = _head_run if "valid" in history[0] else _model_run
        draw(label, history, (axes[0], axes[1]))
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
