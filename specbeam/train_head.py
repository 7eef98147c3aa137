"""`python -m specbeam.train_head`: train a draft head (`specbeam/training/train_head.py`)."""

from specbeam.training.train_head import cli

if __name__ == "__main__":
    cli()
