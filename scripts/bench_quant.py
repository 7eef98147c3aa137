"""A target call's time in each precision of its linear layers, interleaved.

    .venv/bin/python scripts/bench_quant.py                      # 1, 5, 27, 100 slots
    .venv/bin/python scripts/bench_quant.py --slots 1 5 --repeats 50

One target per precision (`specbeam.kernels.quant`), each timed as verification times it
(`specbeam.apps.calibrate.CallTimer`: one source, 5 hypotheses of a 30-token prefix, the
lean decoder and the projection of every slot); every precision and slot count in turn,
repeated, so machine noise falls alike. Prints min and median ms per call.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import load_config  # noqa: E402

from specbeam.apps.calibrate import CallTimer  # noqa: E402
from specbeam.integration.models import open_pair  # noqa: E402
from specbeam.kernels import quant  # noqa: E402

PRECISIONS = ("float32", *quant.PRECISIONS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 5, 27, 100])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="bible_es_en", help="conf/model/<name>.yaml")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.model, "cpu")
    pair = open_pair(cfg.model, cfg.task.src_lang, cfg.task.tgt_lang, with_draft=False)
    encode = pair.tokenizer.create_encoder(lang=cfg.task.src_lang, mode="source")
    source = encode(cfg.task.split("dev")[0].source)
    timers = {}
    with torch.inference_mode():
        for precision in PRECISIONS:
            target = quant.quantize(copy.deepcopy(pair.target), precision).eval()
            timers[precision] = CallTimer(
                target, source, hyps=5, prefix_len=30, max_slots=max(args.slots), lean=True
            )
            timers[precision](max(args.slots))  # warm-up: packing, first allocations
        samples = {(p, t): [] for p in PRECISIONS for t in args.slots}
        for _ in range(args.repeats):
            for t in args.slots:
                for p, timer in timers.items():
                    samples[p, t].append(1000 * timer(t))
    print(f"target call, ms (min / median of {args.repeats}), threads={args.threads}")
    print("| slots | " + " | ".join(PRECISIONS) + " |")
    print("|---|" + "---|" * len(PRECISIONS))
    for t in args.slots:
        cells = [f"{min(samples[p, t]):.2f} / {statistics.median(samples[p, t]):.2f}" for p in PRECISIONS]  # fmt: skip
        print(f"| {t} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
