"""`python -m specbeam.build_native`: build the lean decoders' native layers once (`specbeam/kernels/native.py`)."""

from specbeam.kernels.native import main

if __name__ == "__main__":
    main()
