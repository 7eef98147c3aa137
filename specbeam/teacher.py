"""`python -m specbeam.teacher`: a teacher's top-k distributions over a training set (`specbeam/training/teacher.py`)."""

from specbeam.training.teacher import main

if __name__ == "__main__":
    main()
