"""`python -m specbeam.merge_shards`: joins translate's shard outputs (`specbeam/apps/merge_shards.py`)."""

from specbeam.apps.merge_shards import main

if __name__ == "__main__":
    main()
