"""`python -m specbeam.train`: train a target or a draft (`specbeam/apps/train.py`)."""

if __name__ == "__main__":
    from specbeam import startup

    startup.begin(hold_gc=False)  # before torch is imported: Ctrl-C then is one line

    from specbeam.apps.train import cli

    cli()
