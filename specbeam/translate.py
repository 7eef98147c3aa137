"""Translates a file (or stdin), one output line per input line, in order.

python -m specbeam.translate input=src.es output=out.en
echo "En el principio crió Dios los cielos y la tierra." | python -m specbeam.translate
python -m specbeam.translate decoding=beam ...       # plain fairseq2 beam search
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import hydra
from fairseq2.generation import SequenceGeneratorOutput
from hydra.core.config_store import ConfigStore
from tqdm import tqdm

from specbeam.app import PipelineConfig, run_app
from specbeam.generator import SpeculativeGeneratorOutput
from specbeam.inference import translate_texts


@dataclass(kw_only=True)
class TranslateConfig(PipelineConfig):
    input: str = "-"
    output: str = "-"
    stats_file: str | None = None
    """Optional JSONL with one record of statistics per input line."""


ConfigStore.instance().store(name="translate_schema", node=TranslateConfig)


def read_lines(path: str) -> list[str]:
    if path == "-":
        return sys.stdin.read().splitlines()
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise SystemExit(f"error: cannot read input {path}: {error.strerror}") from None


def open_output(path: str) -> TextIO:
    if path == "-":
        return sys.stdout
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as error:
        raise SystemExit(f"error: cannot write output {path}: {error.strerror}") from None


def translate(cfg: TranslateConfig) -> None:
    tokenizer, generator = cfg.build()
    lines = read_lines(cfg.input)
    todo = [i for i, line in enumerate(lines) if line.strip()]  # blank lines stay blank
    records: dict[int, dict] = {}
    bar = tqdm(
        total=len(todo),
        unit="sent",
        disable=cfg.input == "-" or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    last = [time.perf_counter()]

    def on_batch(batch: list[int], out: SequenceGeneratorOutput) -> None:
        now = time.perf_counter()
        for row, i in enumerate(batch):
            record = {"line": todo[i] + 1, "batch_size": len(batch), "batch_seconds": now - last[0]}
            if isinstance(out, SpeculativeGeneratorOutput):
                passes, steps = out.stats.passes_per_source[row], out.stats.steps_per_source[row]
                record.update(target_passes=passes, steps=steps, tau=steps / max(passes, 1))
            records[todo[i]] = record
        last[0] = now
        bar.update(len(batch))

    translations = translate_texts(
        generator, tokenizer, [lines[i] for i in todo], cfg.task.src_lang, cfg.task.tgt_lang,
        max_tokens=cfg.hardware.batch_tokens, on_batch=on_batch,
    )  # fmt: skip
    bar.close()
    outputs = [""] * len(lines)
    for i, text in zip(todo, translations, strict=True):
        outputs[i] = text
    out = open_output(cfg.output)
    out.writelines(line + "\n" for line in outputs)
    out.flush()
    if out is not sys.stdout:
        out.close()
    if cfg.stats_file:
        with open(cfg.stats_file, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(records[i]) + "\n" for i in sorted(records))


@hydra.main(version_base=None, config_path="../conf", config_name="translate")
def main(cfg: TranslateConfig) -> None:
    run_app(translate, cfg)


if __name__ == "__main__":
    main()
