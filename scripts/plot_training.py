"""Draws dev BLEU and training loss per epoch from `python -m specbeam.train` histories.

python scripts/plot_training.py --out curves.png target=~/.cache/specbeam/target draft=~/.cache/specbeam/draft
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("runs", nargs="+", help="label=training output directory")
    args = parser.parse_args(argv)
    fig, (bleu_ax, loss_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for run in args.runs:
        label, _, folder = run.partition("=")
        history = json.loads((Path(folder).expanduser() / "history.json").read_text())
        epochs = [h["epoch"] for h in history]
        bleu_ax.plot(epochs, [h["dev_bleu_greedy"] for h in history], "o-", label=label)
        loss_ax.plot(epochs, [h["train_loss"] for h in history], "o-", label=label)
    bleu_ax.set(xlabel="epoch", ylabel="dev BLEU (greedy)")
    loss_ax.set(xlabel="epoch", ylabel="training loss (label-smoothed)")
    for ax in (bleu_ax, loss_ax):
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
