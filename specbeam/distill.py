"""`python -m specbeam.distill`: the target's translations of the training sources (`specbeam/training/distill.py`)."""

from specbeam.training.distill import cli

if __name__ == "__main__":
    cli()
