"""Joins the outputs of `python -m specbeam.translate shard=i/n` back into one file.

    python scripts/merge_shards.py --input src.es --output out.en out.0 out.1 out.2

Shards are contiguous blocks of the input, so the join is a concatenation in shard
order; it is refused unless every shard has exactly the lines it owns.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specbeam.apps.app import shard_range
from specbeam.apps.textio import read_lines


def merge(input_path: str, shard_paths: list[Path], output: Path) -> None:
    total = len(read_lines(input_path, errors="replace"))
    n = len(shard_paths)
    parts = []
    for i, path in enumerate(shard_paths):
        begin, end = shard_range(f"{i}/{n}", total)
        if not path.exists():
            raise ValueError(
                f"shard {i}/{n}: {path} does not exist (is it still running? look for {path}.partial)"
            )
        data = path.read_bytes()
        lines = data.count(b"\n")
        if lines != end - begin or (data and not data.endswith(b"\n")):
            raise ValueError(
                f"shard {i}/{n}: {path} has {lines} lines, expected {end - begin} (lines {begin + 1}–{end} of {input_path})"
            )
        parts.append(data)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_bytes(b"".join(parts))
    os.replace(tmp, output)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--input", required=True, help="the input all shards were cut from")
    parser.add_argument("--output", type=Path, required=True)
    parser.add_argument("shards", type=Path, nargs="+", help="shard outputs, in order 0, 1, …")
    args = parser.parse_args(argv)
    try:
        merge(args.input, args.shards, args.output)
    except ValueError as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
