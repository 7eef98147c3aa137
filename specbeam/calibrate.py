"""`python -m specbeam.calibrate`: tune a decoding's settings on this machine (`specbeam/apps/calibrate.py`)."""

from specbeam.apps.calibrate import cli

if __name__ == "__main__":
    cli()
