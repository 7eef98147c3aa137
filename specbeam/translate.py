"""`python -m specbeam.translate`: translate a file or stdin (`specbeam/apps/translate.py`)."""

from specbeam.apps.translate import cli

if __name__ == "__main__":
    cli()
