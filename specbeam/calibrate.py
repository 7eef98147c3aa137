"""`python -m specbeam.calibrate`: tune a decoding's settings on this machine (`specbeam/apps/calibrate.py`)."""

if __name__ == "__main__":
    from specbeam import startup

    startup.begin(hold_gc=False)  # before torch is imported: Ctrl-C then is one line

    from specbeam.apps.calibrate import cli

    cli()
