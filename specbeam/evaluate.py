"""`python -m specbeam.evaluate`: compare decodings side by side: BLEU, exactness, speed (`specbeam/apps/evaluate.py`)."""

if __name__ == "__main__":
    from specbeam import startup

    startup.begin(hold_gc=False)  # before torch is imported: Ctrl-C then is one line

    from specbeam.apps.evaluate import cli

    cli()
