"""`python -m specbeam.translate`: translate a file or stdin (`specbeam/apps/translate.py`)."""

if __name__ == "__main__":
    from specbeam import startup

    startup.begin()  # before torch is imported

    from specbeam.apps.translate import cli

    cli()
