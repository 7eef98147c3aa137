"""Checkpoint averaging: the mean of several checkpoints' weights, one model.

    python -m specbeam.average OUT.pt ~/.cache/specbeam/target_e5.pt \\
        ~/.cache/specbeam/target/last.pt

Averaging two points of one training run is a cheap ensemble: on the embedded task the
mean of epoch 5 and step 2108 scored 1.6 dev BLEU above either. Inputs are `save_model`
checkpoints (best.pt) or the trainer's own (last.pt); all must share one architecture.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from specbeam.integration.models import ModelArch, build_model, save_model
from specbeam.plural import counted


def read_weights(path: Path) -> tuple[ModelArch, dict[str, torch.Tensor]]:
    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    if ckpt.get("shares_encoder", False):
        raise ValueError(f"{path}: a draft without its encoder cannot be averaged alone")
    arch = ckpt["arch"] if "arch" in ckpt else ckpt["config"]["arch"]
    return ModelArch.stored(arch, path), ckpt["model"]


def average(paths: list[Path]) -> tuple[ModelArch, dict[str, torch.Tensor]]:
    arch, first = read_weights(paths[0])
    total = {k: v.double() for k, v in first.items()}
    for path in paths[1:]:
        other_arch, weights = read_weights(path)
        if other_arch != arch or weights.keys() != total.keys():
            raise ValueError(f"{path} has another architecture than {paths[0]}")
        for k, v in weights.items():
            total[k] += v.double()
    return arch, {k: (v / len(paths)).float() for k, v in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("checkpoints", type=Path, nargs="+")
    args = parser.parse_args()
    arch, weights = average([p.expanduser() for p in args.checkpoints])
    model = build_model(arch)
    model.load_state_dict(weights)
    save_model(model, arch, args.out.expanduser(), torch.float32)
    print(f"wrote {args.out}: the mean of {counted(len(args.checkpoints), 'checkpoint')}")
