"""`python -m specbeam.average`: average checkpoints into one model (`specbeam/training/average.py`)."""

from specbeam.training.average import main

if __name__ == "__main__":
    main()
