"""Distillation data from the chunks done so far: the target's translations where a chunk
exists, the references elsewhere (what the shipped head was trained on, 2026-12-01).

    .venv/bin/python scripts/mix_distill.py ~/.cache/specbeam/distill ~/.cache/specbeam/distill/train_mixed.tsv
"""

from __future__ import annotations

import argparse
from pathlib import Path

from specbeam.apps.task import TaskConfig
from specbeam.training.distill import chunk_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("distill_dir", type=Path, help="`python -m specbeam.distill`'s out_dir")
    parser.add_argument("out", type=Path)
    parser.add_argument("--chunk-size", type=int, default=256, help="the distill run's chunk_size")
    args = parser.parse_args()
    pairs = TaskConfig().split("train")
    size, parts, references = args.chunk_size, [], 0
    for c in range(-(-len(pairs) // size)):
        path = chunk_path(args.distill_dir.expanduser(), c)
        if path.exists():
            parts.append(path.read_text(encoding="utf-8"))
        else:
            rows = pairs[c * size : (c + 1) * size]
            parts.append("".join(f"{p.ref}\t{p.source}\t{p.target}\n" for p in rows))
            references += len(rows)
    args.out.write_text("".join(parts), encoding="utf-8")
    print(f"wrote {args.out}: {len(pairs)} pairs, {references} of them references")


if __name__ == "__main__":
    main()
