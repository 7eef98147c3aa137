"""Joins the outputs of `python -m specbeam.translate shard=i/n` back into one file.

    python -m specbeam.merge_shards --input src.es --output out.en [SHARD ...]

Without SHARD files it joins out.en.shard-0-of-n … out.en.shard-(n-1)-of-n, the files
translate writes for `output=out.en shard=i/n`; the same works for a stats_file, and for
output_format=jsonl (one line per input line each). Shards are contiguous blocks of the
input, so the join is a concatenation in shard order; it is refused unless every shard
has exactly the lines it owns, and unless the shards come from one run: translate writes
beside each finished shard a record (`<shard>.json`: the input's sha256 and the settings
the output depends on), and shards of another input than --input, or whose settings
differ, are refused by name. A shard without a record (an older specbeam's) is joined
with a warning. The shard files are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

from specbeam.apps.app import shard_path, shard_range
from specbeam.apps.textio import (
    finished_record,
    input_digest,
    read_input,
    setting_differences,
    split_lines,
)
from specbeam.plural import counted

SHARD = re.compile(r"\.shard-(\d+)-of-(\d+)$")
"""The suffix `app.shard_path` gives shard i of n: `.shard-i-of-n`."""


def find_shards(output: Path) -> list[Path]:
    """The shard files translate wrote for `output`, in shard order."""
    found = [
        m
        for p in output.parent.glob(f"{output.name}.shard-*")
        if (m := SHARD.search(p.name)) and p.name[: m.start()] == output.name
    ]
    counts = sorted({int(m[2]) for m in found})
    if not counts:
        raise ValueError(
            f"no shard files {output}.shard-i-of-n (are they still running? look for .partial)"
        )
    if len(counts) > 1:
        raise ValueError(
            f"{output} has shards of several splits (of {', '.join(map(str, counts))}): "
            "name the shard files to join"
        )
    n = counts[0]
    return [Path(shard_path(str(output), f"{i}/{n}")) for i in range(n)]


def merge(input_path: str, shard_paths: list[Path], output: Path) -> None:
    data = read_input(input_path)
    total, digest = len(split_lines(data, input_path, errors="replace")), input_digest(data)
    n = len(shard_paths)
    parts = []
    first: tuple[Path, dict] | None = None  # the first shard with a record, and its settings
    for i, path in enumerate(shard_paths):
        begin, end = shard_range(f"{i}/{n}", total)
        named = SHARD.search(path.name)
        if named and (int(named[1]), int(named[2])) != (i, n):
            raise ValueError(
                f"{path} is shard {named[1]}/{named[2]}, given as shard {i}/{n}: name the "
                "shard files in order 0, 1, …"
            )
        partial = path.with_name(path.name + ".partial")
        if partial.exists():
            raise ValueError(
                f"shard {i}/{n}: {partial} exists: a run of this shard is still going or was "
                f"interrupted (run it again to finish it); {path} may be an older job's"
            )
        if not path.exists():
            raise ValueError(
                f"shard {i}/{n}: {path} does not exist (is it still running? look for {path}.partial)"
            )
        settings = shard_settings(path, f"{i}/{n}", input_path, digest)
        if settings is not None and first is None:
            first = (path, settings)
        elif settings is not None and first is not None:
            check_same_settings(*first, path, settings)
        data = path.read_bytes()
        lines = data.count(b"\n")
        if lines != end - begin or (data and not data.endswith(b"\n")):
            raise ValueError(
                f"shard {i}/{n}: {path} has {counted(lines, 'line')}, expected {end - begin} (lines {begin + 1}–{end} of {input_path})"
            )
        parts.append(data)
    tmp = output.with_name(output.name + ".tmp")
    try:
        tmp.write_bytes(b"".join(parts))
    except OSError as error:
        raise ValueError(f"cannot write --output {output}: {error.strerror}") from None
    os.replace(tmp, output)
    print(f"wrote {output}: {counted(total, 'line')} from {counted(n, 'shard')}", file=sys.stderr)


def shard_settings(path: Path, shard: str, input_path: str, digest: str) -> dict | None:
    """The settings in the record translate wrote beside a finished shard, after checking
    that the record is this shard's and its input is --input's bytes (an input edited
    between shards' runs moves every later shard's lines). None, with a warning, for a
    shard an older specbeam wrote: it has no record."""
    record_path = finished_record(path)
    if not record_path.exists():
        print(
            f"warning: shard {shard}: {path} has no record {record_path} (written by an older "
            "specbeam?): not checked against the input and the other shards' settings",
            file=sys.stderr,
        )
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        settings, source = dict(record["settings"]), record["input"]
        sha256 = str(record["input_sha256"])
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(
            f"shard {shard}: {record_path} is not a record translate wrote: delete it to join "
            f"{path} unchecked"
        ) from None
    if settings.get("shard") != shard:
        raise ValueError(
            f"shard {shard}: {record_path} records shard {settings.get('shard')}: {path} is "
            f"another shard's output renamed or copied; translate shard {shard} again"
        )
    if sha256 != digest:
        raise ValueError(
            f"shard {shard}: {path} was translated from other text than --input {input_path} "
            f"(input={source} with sha256 {sha256[:12]}…, not {digest[:12]}…): translate it "
            "again from this input"
        )
    return settings


def check_same_settings(first: Path, ours: dict, path: Path, theirs: dict) -> None:
    """Shards translated with other settings (another decoding, model or precision) would
    join into a file no single run writes: refused, naming each setting that differs."""
    differ = setting_differences(ours, theirs, skip={"shard"})
    if differ:
        raise ValueError(
            f"{first} and {path} come from different runs: {', '.join(differ)}; translate "
            "every shard with the same settings"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m specbeam.merge_shards", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--input", required=True, help="the input all shards were cut from")
    parser.add_argument(
        "--output", type=Path, required=True, help="the joined file (shards: OUTPUT.shard-i-of-n)"
    )
    parser.add_argument(
        "shards", type=Path, nargs="*", help="shard files, in order 0, 1, … (default: found)"
    )
    args = parser.parse_args(argv)
    try:
        merge(args.input, args.shards or find_shards(args.output), args.output)
    except ValueError as error:
        sys.exit(f"error: {error}")
