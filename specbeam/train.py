"""`python -m specbeam.train`: train a target or a draft (`specbeam/training/train.py`)."""

from specbeam.training.train import cli

if __name__ == "__main__":
    cli()
