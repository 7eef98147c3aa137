"""`python -m specbeam.train_head`: train a draft head (`specbeam/apps/train_head.py`)."""

if __name__ == "__main__":
    from specbeam import startup

    startup.begin(hold_gc=False)  # before torch is imported: Ctrl-C then is one line

    from specbeam.apps.train_head import cli

    cli()
