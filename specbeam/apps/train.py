"""Trains a translation model (target or draft) on a task; resumable, time-budgeted.

    python -m specbeam.train arch=target out_dir=~/.cache/specbeam/target
    python -m specbeam.train arch=draft_small out_dir=~/.cache/specbeam/draft \
        train_targets=~/.cache/specbeam/distill/train.tsv

The trainer: `specbeam/training/train.py`.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.config_store import ConfigStore

from specbeam.apps.app import before_hydra, run_app
from specbeam.paths import SHIPPED
from specbeam.training.train import TrainConfig, Trainer

ConfigStore.instance().store(name="train_schema", node=TrainConfig)


@hydra.main(version_base=None, config_path=str(SHIPPED / "conf"), config_name="train")
def main(cfg: TrainConfig) -> None:
    run_app(lambda c: Trainer(c).run(), cfg)


def cli() -> None:
    """The command line (`app.before_hydra`)."""
    before_hydra(sys.argv[1:], "train", __doc__)
    main()
