"""`python -m specbeam.build_native`: build the lean decoders' native layers once (`specbeam/search/native.py`)."""

from specbeam.search.native import main

if __name__ == "__main__":
    main()
