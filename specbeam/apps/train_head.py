"""Trains a draft head (`specbeam/search/head.py`) on the target's own translations;
resumable, time-budgeted, with a curves PNG.

    python -m specbeam.train_head model.target=<card> data=~/.cache/specbeam/distill/train.tsv \
        out_dir=~/.cache/specbeam/head time_budget_minutes=60

The target and the task are those `python -m specbeam.distill` made `data` with (README,
"A draft head for your own model").

The trainer and the algorithm: `specbeam/training/train_head.py`.
"""

from __future__ import annotations

import sys

import hydra
from hydra.core.config_store import ConfigStore

from specbeam.apps.app import before_hydra, run_app
from specbeam.paths import SHIPPED
from specbeam.training.train_head import HeadTrainer, TrainHeadConfig

ConfigStore.instance().store(name="train_head_schema", node=TrainHeadConfig)


@hydra.main(version_base=None, config_path=str(SHIPPED / "conf"), config_name="train_head")
def main(cfg: TrainHeadConfig) -> None:
    run_app(lambda c: HeadTrainer(c).run(), cfg)


def cli() -> None:
    """The command line (`app.before_hydra`)."""
    before_hydra(sys.argv[1:], "train_head", __doc__)
    main()
