"""`python -m specbeam.cards`: fairseq2 asset cards for specbeam checkpoints (`specbeam/integration/cards.py`)."""

from specbeam.integration.cards import main

if __name__ == "__main__":
    main()
