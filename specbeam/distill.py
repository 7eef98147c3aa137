"""`python -m specbeam.distill`: the target's translations of the training sources (`specbeam/training/distill.py`)."""

if __name__ == "__main__":
    from specbeam import startup

    startup.begin(hold_gc=False)  # before torch is imported: Ctrl-C then is one line

    from specbeam.training.distill import cli

    cli()
