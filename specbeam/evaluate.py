"""`python -m specbeam.evaluate`: compare decodings side by side: BLEU, exactness, speed (`specbeam/apps/evaluate.py`)."""

from specbeam.apps.evaluate import cli

if __name__ == "__main__":
    cli()
