"""The documented chain for a draft head over any target (README, "A draft head for your
own model"), end to end as users run it, on a target that is not the Bible pair: a tiny
NLLB-architecture model from fairseq2's factory, with its own SentencePiece model, behind
a card in a temporary asset directory, on a synthetic task. Every step is a command line
that takes the target by card and the task as configuration, and reads what the step
before it wrote; exact speculative beam search with the trained head must then translate
as beam search does."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import sentencepiece as spm

from specbeam.integration.cards import tokenizer_fields, write_cards
from specbeam.paths import SHIPPED

SRC, TGT = "xqa_Latn", "yqb_Latn"  # made-up languages, NLLB-style codes
SYLLABLES = ["ka", "lo", "mi", "ne", "su", "ta", "ri", "po", "de", "gu"]
# The target language: each syllable has its counterpart, and word order is reversed.
COUNTERPART = dict(
    zip(SYLLABLES, ["zo", "vi", "ha", "tu", "ke", "ba", "fe", "wu", "ji", "ro"], strict=True)
)


TINY_ARCH = [
    "arch.model_dim=64", "arch.num_encoder_layers=1", "arch.num_decoder_layers=2",
    "arch.num_attn_heads=4", "arch.ffn_inner_dim=128", "arch.dropout_p=0", "arch.max_seq_len=128",
]  # fmt: skip


def synthetic_corpus(rows: int, seed: int) -> list[tuple[str, str]]:
    """Sentence pairs of the two made-up languages, by a deterministic mapping."""
    rng = random.Random(seed)
    words = sorted({"".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))) for _ in range(60)})
    pairs = []
    for _ in range(rows):
        sentence = rng.choices(words, k=rng.randint(2, 6))
        translated = [
            "".join(COUNTERPART[word[i : i + 2]] for i in range(0, len(word), 2))
            for word in reversed(sentence)
        ]
        pairs.append((" ".join(sentence).capitalize() + ".", " ".join(translated) + "."))
    return pairs


def write_task(data_dir: Path) -> None:
    data_dir.mkdir(parents=True)
    corpus = synthetic_corpus(260, seed=0)
    for split, rows in (("train", corpus[:220]), ("dev", corpus[220:240]), ("test", corpus[240:])):
        with open(data_dir / f"{split}.tsv", "w", encoding="utf-8") as f:
            f.writelines(f"{split}-{i}\t{s}\t{t}\n" for i, (s, t) in enumerate(rows))


def train_tokenizer(data_dir: Path, path: Path) -> int:
    """A unigram SentencePiece model of both languages; fairseq2's NLLB family adds
    `<pad>`, the two language tokens and three internal symbols: its vocabulary size."""
    lines = [
        text
        for row in (data_dir / "train.tsv").read_text(encoding="utf-8").splitlines()
        for text in row.split("\t")[1:]
    ]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_prefix=str(path.with_suffix("")), vocab_size=90,
        model_type="unigram", character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=1, minloglevel=2,
    )  # fmt: skip
    return spm.SentencePieceProcessor(model_file=str(path)).get_piece_size() + 6


def run(app: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    """`python -m specbeam.<app> args…`, as a user runs it; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(SHIPPED), "OMP_NUM_THREADS": "1", **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", f"specbeam.{app}", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"specbeam.{app} failed:\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_head_chain_runs_for_a_target_by_card(tmp_path: Path) -> None:
    data, cards, work = tmp_path / "data", tmp_path / "cards", tmp_path / "work"
    write_task(data)
    tokenizer = tmp_path / "spm.model"
    vocab_size = train_tokenizer(data, tokenizer)
    task = [f"task.data_dir={data}", f"task.columns=[ref,{SRC},{TGT}]",
            f"task.src_lang={SRC}", f"task.tgt_lang={TGT}"]  # fmt: skip
    # The user's target: an NLLB model of fairseq2's factory, a few steps into training
    # (random weights make a degenerate oracle), behind its card.
    cards.mkdir()
    spm_card = {"name": "chain_spm", **tokenizer_fields(tokenizer, cards, [SRC, TGT], TGT)}
    write_cards(cards / "spm.yaml", [spm_card])
    run("train", "tokenizer=chain_spm", *TINY_ARCH, f"arch.vocab_size={vocab_size}", *task,
        f"out_dir={work}/target", "max_steps=120", "max_tokens=2000", "warmup_steps=30",
        "lr=3e-3", "label_smoothing=0", "dev_sentences=3", "threads=1",
        cwd=tmp_path, env={"FAIRSEQ2_USER_ASSET_DIR": str(cards)})  # fmt: skip
    run("cards", str(cards / "target.yaml"), f"chain_target={work}/target/best.pt",
        "--tokenizer", str(tokenizer), "--langs", f"{SRC},{TGT}", "--default-lang", TGT,
        cwd=tmp_path)  # fmt: skip
    # The target by card, the task as configuration: what every step is given.
    target_task = ["model.target=chain_target", f"model.asset_dirs=[{cards}]", *task]
    common = [*target_task, "hardware.threads=1"]

    run("distill", *common, "model.draft=none", "decoding=beam", f"out_dir={work}/distill",
        "chunk_size=64", cwd=tmp_path)  # fmt: skip
    distilled = (work / "distill/train.tsv").read_text(encoding="utf-8").splitlines()
    assert len(distilled) == 220

    run("train_head", *target_task, f"data={work}/distill/train.tsv",
        f"data_cache={work}/head_states.pt", f"out_dir={work}/head", "max_epochs=10", "lr=2e-3", "warmup_steps=20",
        "valid_pairs=20", "valid_every_steps=1000", "max_tokens=1000", "threads=1",
        cwd=tmp_path)  # fmt: skip
    assert (work / "head_states.pt").exists() and (work / "head/best.pt").exists()

    run("cards", str(cards / "head.yaml"), f"chain_head={work}/head/best.pt",
        "--tokenizer-of", "chain_target", cwd=tmp_path)  # fmt: skip
    pair = [*common, "model.draft=chain_head"]

    # A tiny target's timed calls cost more than inside a search: its negative work beside
    # the calls is written as 0, also where other processes keep this machine busy.
    printed = run("calibrate", *pair, f"hardware_dir={work}/conf/hardware", "name=chain",
        "gammas=[2,3]", "draft_widths=[5]", "sample=3", "repeats=2", "slot_counts=[1,5,10]",
        "busy_cpus=1000", cwd=tmp_path)  # fmt: skip
    assert "use: hardware=chain" in printed
    assert "model.target=chain_target, model.draft=chain_head" in (
        work / "conf/hardware/chain.yaml"
    ).read_text(encoding="utf-8")

    source = work / "test.src"
    source.write_text(
        "".join(row.split("\t")[1] + "\n" for row in (data / "test.tsv").read_text().splitlines())
    )
    calibrated = ["hardware=chain", f"hydra.searchpath=[file://{work}/conf]"]
    outputs = {}
    for decoding in ("beam", "spec_beam"):
        out = work / f"{decoding}.out"
        extra = ["decoding.plan=false", f"stats_file={work}/stats.jsonl"]
        run("translate", *pair, *calibrated, f"decoding={decoding}", f"input={source}",
            f"output={out}", *(extra if decoding == "spec_beam" else []),
            cwd=tmp_path)  # fmt: skip
        outputs[decoding] = out.read_text(encoding="utf-8").splitlines()
    assert len(outputs["beam"]) == 20
    assert outputs["spec_beam"] == outputs["beam"]
    records = [json.loads(line) for line in (work / "stats.jsonl").read_text().splitlines()]
    assert records and all("target_passes" in r for r in records)  # speculated, never plain
    assert sum(r["tau"] for r in records) / len(records) > 1.1  # drafted tokens were accepted
