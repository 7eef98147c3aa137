"""Translates a file (or stdin), one output line per input line, in order.

python -m specbeam.translate input=src.es output=out.en
echo "En el principio crió Dios los cielos y la tierra." | python -m specbeam.translate
python -m specbeam.translate decoding=beam ...       # plain fairseq2 beam search
python -m specbeam.translate compare=beam ...        # and print the speedup over it
python -m specbeam.translate "compare='beam:beam_size=4'" ...  # Hydra needs the inner quotes
python -m specbeam.translate output_format=jsonl nbest=3 ...   # n-best lists, scores, stats
python -m specbeam.translate -m hydra/launcher=joblib shard=0/2,1/2 hardware.threads=1 \
    input=src.es output=out.en                              # 2 jobs × 1 thread on 2 cores
python -m specbeam.merge_shards --input src.es --output out.en   # joins out.en.shard-*-of-2

Standard input is streamed (`textio.stream_lines`): lines are translated as they arrive
and each batch's output is flushed, so the app works as a filter in a pipe.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass

import hydra
from fairseq2.data.tokenizers import Tokenizer
from fairseq2.generation import Seq2SeqGenerator, SequenceGeneratorOutput
from hydra.core.config_store import ConfigStore
from tqdm import tqdm

from specbeam import startup
from specbeam.apps.app import (
    PipelineConfig,
    before_hydra,
    parse_shard,
    run_app,
    shard_path,
    shard_range,
)
from specbeam.apps.compare import MethodRun, run_side_by_side
from specbeam.apps.decoding import DecodingConfig, load_decoding, make_generator
from specbeam.apps.split import Split, Splitter, flatten, join
from specbeam.apps.textio import (
    InputLog,
    ResumableOutput,
    UnreadableInput,
    input_digest,
    job_fingerprint,
    read_input,
    split_lines,
    stream_lines,
    uninterrupted,
)
from specbeam.data.inference import Translation, translate_batches
from specbeam.paths import SHIPPED
from specbeam.plural import counted
from specbeam.search.stats import SpeculativeGeneratorOutput

log = logging.getLogger("specbeam.translate")

_SHARED = ("len_penalty", "min_gen_len", "max_gen_len", "unk_penalty", "temperature")
"""Decoding settings that define the task rather than the search: compare= keeps them."""


@dataclass(kw_only=True)
class TranslateConfig(PipelineConfig):
    input: str = "-"
    """A file, or - : standard input, translated as its lines arrive."""
    output: str = "-"
    """A file (through a symlink, its target), written as `<output>.partial` and renamed
    when complete so that a rerun resumes; or - (stdout), or an existing FIFO or device,
    written straight through (not resumable)."""
    output_format: str = "text"
    """text: each line's translation; jsonl: one JSON object per input line with its
    n-best list, scores and search statistics (`line_object`), for pipelines."""
    nbest: int = 1
    """Translations per line in output_format=jsonl, best first: at most
    decoding.beam_size (1 for sampling)."""
    stats_file: str | None = None
    """Optional JSONL with one record of statistics per input line."""
    chunk_lines: int = 256
    """Lines batched together, then written and flushed, at a time; an interrupt writes
    the chunk's finished lines up to its first unfinished one and keeps the later ones for
    the rerun. From stdin, at most this many of the lines that have arrived."""
    shard: str = "0/1"
    """i/n: translate only the i-th of n contiguous blocks of the input file, into
    `<output>.shard-i-of-n` (and `<stats_file>.shard-i-of-n`), so that one command swept
    over shards writes distinct files; `python -m specbeam.merge_shards` joins them."""
    input_errors: str = "strict"
    """Invalid UTF-8 or a NUL byte in the input: strict (stop, naming the line) or replace
    (U+FFFD)."""
    compare: str | None = None
    """A decoding (e.g. beam, or "compare='beam:beam_size=4'" quoted so, as Hydra's grammar
    needs) to time against this one afterwards on the same lines (the
    same pieces of split lines), one at a time, interleaved: prints the speedup and how
    many outputs are identical."""
    split_above_tokens: int = 50
    """A line longer than this many SentencePiece pieces is split into sentences (then at
    clause punctuation, then by a token window), its pieces translated in the same batches
    as other lines and their translations joined with a space (specbeam/apps/split.py);
    conf/translate.yaml says why 50. 0 = off: a line is decoded whole, and one above the
    model's source length is cut to it, with a warning."""

    def check(self) -> None:
        """The settings only this app has, before any model is loaded."""
        if self.output_format not in ("text", "jsonl"):
            raise ValueError(f"output_format={self.output_format} is invalid: allowed: text, jsonl")
        if self.decoding.search != "beam" and self.nbest != 1:
            raise ValueError(
                f"nbest={self.nbest} is invalid: decoding={self.decoding.name} samples one "
                "translation per line (nbest=1)"
            )
        if not 1 <= self.nbest <= self.decoding.beam_size:
            raise ValueError(
                f"nbest={self.nbest} is invalid: must be 1 to decoding.beam_size="
                f"{self.decoding.beam_size}"
            )
        if self.nbest > 1 and self.output_format == "text":
            raise ValueError(
                f"nbest={self.nbest} needs output_format=jsonl: text has one translation per line"
            )
        if self.chunk_lines < 1:
            raise ValueError(f"chunk_lines={self.chunk_lines} is invalid: must be ≥ 1")
        self._check_paths()
        if parse_shard(self.shard) != (0, 1) and self.input == "-":
            raise ValueError(
                f"shard={self.shard} needs input=FILE: stdin is streamed, and every shard must "
                "read the same lines"
            )
        if self.stats_file is not None and (
            self.stats_file == self.output == "-"
            or "-" not in (self.stats_file, self.output)
            and _same_file(self.stats_file, self.output)
        ):
            raise ValueError(
                f"stats_file={self.stats_file} is the output: choose another stats_file (the "
                "records would be mixed into the translations)"
            )
        for setting, path in (("output", self.output), ("stats_file", self.stats_file)):
            if path is None or "-" in (self.input, path):
                continue
            if _same_file(self.input, shard_path(path, self.shard)):
                raise ValueError(
                    f"{setting}={path} is the input file: choose another {setting} (it "
                    "would overwrite the text being translated)"
                )
        if self.compare is not None:
            self.baseline()

    def _check_paths(self) -> None:
        """An empty path or a directory given for a file, before the models load: an empty
        output would be the working directory, found only when the finished file is renamed."""
        streams = {"input": "stdin", "output": "stdout", "stats_file": "stdout"}
        for setting, path in (("input", self.input), ("output", self.output), ("stats_file", self.stats_file)):  # fmt: skip
            if path is None:
                continue
            if not path.strip():
                raise ValueError(f"{setting} is empty: give a file, or - for {streams[setting]}")
            if setting != "input" and path != "-" and (path.endswith("/") or os.path.isdir(path)):
                raise ValueError(f"{setting}={path} is a directory: give a file in it")

    def baseline(self) -> DecodingConfig:
        """compare='s decoding with this run's length and scoring settings (`_SHARED`)."""
        assert self.compare is not None
        try:
            loaded = load_decoding(self.compare)
        except ValueError as error:
            reason = str(error).removeprefix("methods: ").removeprefix(f"{self.compare}: ")
            raise ValueError(f"compare={self.compare} is invalid: {reason}") from None
        shared = {f: getattr(self.decoding, f) for f in _SHARED}
        baseline = dataclasses.replace(loaded, **shared)  # type: ignore[arg-type]
        if baseline.speculative:
            raise ValueError(
                f"compare={self.compare} is speculative: compare with a plain decoding"
            )
        return baseline


def _same_file(a: str, b: str) -> bool:
    """Whether two paths name one file (through symlinks), existing or not."""
    return os.path.realpath(a) == os.path.realpath(b)


ConfigStore.instance().store(name="translate_schema", node=TranslateConfig)


def translate(cfg: TranslateConfig) -> None:
    cfg.check()
    lines: list[str] | None = None  # stdin: streamed, its length unknown
    first = 0  # lines before this shard's
    total: int | None = None
    unreadable: UnreadableInput | None = None  # a line that is not UTF-8
    digest = "stdin"
    if cfg.input != "-":
        data = read_input(cfg.input)
        digest = input_digest(data)
        try:
            every_line = split_lines(data, cfg.input, cfg.input_errors)
            count = len(every_line)
        except UnreadableInput as error:  # the lines before it are translated, then it ends
            every_line, count, unreadable = error.lines, error.count, error
        first, end = shard_range(cfg.shard, count)
        if len(every_line) >= end:  # none in this shard
            unreadable = None
        lines, total = every_line[first:end], end - first
    tokenizer, generator = cfg.build()
    splitter = Splitter(tokenizer, cfg.task.src_lang, cfg.split_above_tokens)
    output = shard_path(cfg.output, cfg.shard)
    job = job_fingerprint(cfg.input, digest, output_settings(cfg))
    sharded = parse_shard(cfg.shard)[1] > 1  # a finished shard records its run for the merge
    out = ResumableOutput(output, job, record=sharded)
    stats = None
    if cfg.stats_file:
        try:
            path = shard_path(cfg.stats_file, cfg.shard)
            stats = ResumableOutput(path, job, record=sharded, setting="stats_file")
            check_stats_resume(stats, out)
        except ValueError:
            if stats is not None:
                stats.abandon()
            out.abandon()
            raise
        stats.truncate_to(out.done)
    resumed_after = out.done
    if out.done or out.ahead:
        ahead = _ahead(len(out.ahead), len(out.pieces_ahead))
        later = f" ({ahead} finished too)" if ahead else ""
        print(f"resuming {output} after line {out.done}{later}", file=sys.stderr)
    step = cfg.chunk_lines
    chunks: Iterable[tuple[int, list[str]]]  # each with the number of lines before it
    input_log = InputLog(out) if lines is None and out.partial is not None else None
    if lines is None:
        arriving = stream_lines(sys.stdin.fileno(), cfg.input_errors, step)
        if input_log is not None:
            arriving = input_log.checked(arriving)
        chunks = _numbered(_skip(arriving, out.done), out.done)
    else:  # the chunks of an uninterrupted run, so that their batches, and output, are its
        start = out.done - out.done % step
        chunks = ((b, lines[b : b + step]) for b in range(start, len(lines), step))
    bar = tqdm(
        total=total, initial=out.done + len(out.ahead), unit="line", file=sys.stderr,
        disable=output == "-" or total == 0,
    )  # fmt: skip
    split_records: list[dict] = []
    translated: list[str] = []  # for compare=
    writer = InOrderWriter(out, stats)

    def finished(i: int, text: str, record: dict) -> None:
        writer.add(i, text, record)
        bar.update(1)  # as lines finish, not chunks

    try:
        for before, chunk in chunks:
            written = max(0, out.done - before)
            lines_done, pieces_done = writer.start(before, len(chunk))
            translate_chunk(
                cfg, tokenizer, generator, splitter, chunk, 0, first + before, written=written,
                finished=lines_done, finished_pieces=pieces_done, on_line=finished,
                on_piece=writer.add_piece,
            )  # fmt: skip
            split_records += [r for r in writer.flush() if "pieces" in r]
            if cfg.compare:
                translated += chunk[written:]
    except UnreadableInput as error:  # standard input's: the lines before it are written
        unreadable = error
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM (`startup.Terminated`)
        writer.flush()
        out.keep_ahead(writer.ready, writer.pieces)
        kept = _kept(out, total, _ahead(len(writer.ready), len(writer.pieces)))
        bar.close()  # before the message: the bar's last line would follow it
        print(f"{startup.stopped(stop)}: {kept}", file=sys.stderr)
        raise SystemExit(startup.exit_code(stop)) from None
    finally:
        bar.close()
        out.close()
        if stats is not None:
            stats.close()
        if input_log is not None:
            input_log.close()
    if unreadable is not None:  # the lines before it are written
        if not out.done and not out.ahead:  # a partial file would block the corrected command
            out.abandon()
            if stats is not None:
                stats.abandon()
        if out.partial is None or not out.done:
            raise unreadable
        raise ValueError(
            f"{unreadable}; {out.partial} holds the {counted(out.done, 'line')} before it, and "
            "the same command with input_errors=replace continues it"
        )
    out.finish()
    if stats is not None:
        stats.finish()
    if split_records:
        warn_split(split_records, cfg.split_above_tokens, resumed_after)
    if cfg.compare:
        nonblank = [t for t in translated if t.strip()]
        pieces = [p for t in nonblank for p in splitter(t).pieces]
        print(compare_line(cfg, tokenizer, generator, pieces, len(nonblank)), file=sys.stderr)


def check_stats_resume(stats: ResumableOutput, out: ResumableOutput) -> None:
    """A stats file that lacks lines the resumed output has (stats_file added to the rerun,
    or its partial file deleted) would lack their records for good: refused. (The lines
    kept ahead carry their records; a stream, stdout, holds what it was sent.)"""
    if stats.partial is not None and stats.done < out.done:
        raise ValueError(
            f"stats_file={stats.name} has {counted(stats.done, 'record')} of the "
            f"{out.done} lines {out.partial} holds (was stats_file added to the rerun, or "
            "its partial file deleted?): rerun without stats_file, or delete the partial "
            "output to translate from the start"
        )


def output_settings(cfg: TranslateConfig) -> dict[str, object]:
    """The settings an output depends on, after `build` tuned the decoding to this machine:
    a partial output is resumed only with the same, and shards join only with the same
    (`merge_shards`). The target's precision is the one it runs in (auto resolved). Of the
    task, only the languages: its data_dir (an absolute path, another on each install) is
    not read here."""
    return {
        "task.src_lang": cfg.task.src_lang, "task.tgt_lang": cfg.task.tgt_lang,
        "model": cfg.model, "decoding": cfg.decoding,
        "hardware.target_dtype": cfg.hardware.target_precision,
        "split_above_tokens": cfg.split_above_tokens, "shard": cfg.shard,
        "output_format": cfg.output_format, "nbest": cfg.nbest,
    }  # fmt: skip


class InOrderWriter:
    """Writes finished lines, which come out of order (batches are sorted by length), as
    the unbroken run from the first unwritten line; the others wait in `ready` (an
    interrupted run keeps them for its rerun, `ResumableOutput.keep_ahead`, and a rerun
    starts with them). The stats file is written first, so it is never behind the output
    (a resume cuts it back to the output's lines)."""

    def __init__(self, out: ResumableOutput, stats: ResumableOutput | None) -> None:
        self.out, self.stats = out, stats
        self.ready: dict[int, tuple[str, dict]] = dict(out.ahead)  # line index -> line, record
        # (line index, piece index) -> a finished piece of a split line not finished yet
        self.pieces: dict[tuple[int, int], dict] = dict(out.pieces_ahead)
        self.before = 0

    def start(self, before: int, size: int) -> tuple[set[int], dict[tuple[int, int], dict]]:
        """A new chunk of `size` lines after `before`: its lines finished already (ahead),
        and the pieces finished of its other lines, by their indices in the chunk."""
        self.before = before
        lines = {i - before for i in self.ready if before <= i < before + size}
        pieces = {
            (i - before, j): kept
            for (i, j), kept in self.pieces.items()
            if before <= i < before + size
        }
        return lines, pieces

    def add(self, i: int, text: str, record: dict) -> None:
        """Line i of the chunk has finished."""
        line = self.before + i
        self.ready[line] = (text, record)
        for key in [key for key in self.pieces if key[0] == line]:
            del self.pieces[key]

    def add_piece(self, i: int, j: int, kept: dict) -> None:
        """Piece j of line i of the chunk has finished, and the line not yet."""
        self.pieces[self.before + i, j] = kept

    def flush(self) -> list[dict]:
        """Writes the run of finished lines from the first unwritten; their records."""
        run = []
        with uninterrupted():  # the lines taken are written to both files
            while self.out.done + len(run) in self.ready:
                run.append(self.ready.pop(self.out.done + len(run)))
            if run and self.stats is not None:
                self.stats.write([json.dumps(record) for _, record in run])
            if run:
                self.out.write([text for text, _ in run])
        return [record for _, record in run]


def _ahead(lines: int, pieces: int) -> str:
    """Lines finished beyond the first unfinished one, and pieces of split lines not."""
    parts = [counted(lines, "later line")] if lines else []
    parts += [f"{counted(pieces, 'piece')} of split lines"] if pieces else []
    return " and ".join(parts)


def _kept(out: ResumableOutput, total: int | None, later: str) -> str:
    """What an interrupted run leaves (`later`: what it finished beyond the first
    unfinished line, `_ahead`), and whether a rerun continues it."""
    of = "" if total is None else f" of {total}"
    if out.name == "stdout":
        return f"{out.done}{of} lines were written to stdout"
    if out.partial is None:
        return (
            f"{out.done}{of} lines were written to {out.name} (not resumable: not a regular file)"
        )
    kept = f" ({later} in {out.ahead_path})" if later else ""
    return (
        f"{out.done}{of} lines are in {out.partial}{kept}; run the same command again to continue"
    )


def _numbered(chunks: Iterable[list[str]], before: int) -> Iterator[tuple[int, list[str]]]:
    """Each chunk with the number of lines before it."""
    for chunk in chunks:
        yield before, chunk
        before += len(chunk)


def _skip(chunks: Iterable[list[str]], count: int) -> Iterator[list[str]]:
    """The lines after the first `count` (those a resumed output has already)."""
    for chunk in chunks:
        chunk, count = chunk[count:], max(0, count - len(chunk))
        if chunk:
            yield chunk


def warn_split(records: list[dict], limit: int, resumed_after: int = 0, named: int = 20) -> None:
    """One warning per job naming the lines that were split (the stats file has each). A
    resumed run names those of its own part: the lines before it were split, and named,
    by the run that wrote them."""
    flag = {True: ", cut without a boundary", False: ""}
    names = [
        f"{r['line']} ({r['pieces']} pieces{flag[r['cut_without_boundary']]})"
        for r in records[:named]
    ]
    more = f" and {len(records) - named} more" if len(records) > named else ""
    part = f" after line {resumed_after} (this run's part)" if resumed_after else ""
    log.warning(
        "split %s longer than %d source tokens%s and joined their pieces' translations: %s %s%s",
        counted(len(records), "line"),
        limit,
        part,
        "line" if len(records) == 1 else "lines",
        ", ".join(names),
        more,
    )


def compare_line(
    cfg: TranslateConfig,
    tokenizer: Tokenizer,
    generator: Seq2SeqGenerator,
    texts: list[str],
    lines: int | None = None,
) -> str:
    """Decodes `texts` with both decodings, batch by batch in turn (same models, inputs
    and threads), and says how they compare. The baseline keeps this run's length and
    scoring settings; its search (and beam size) is its own, e.g.
    `"compare='beam:beam_size=4'"` (quoted for Hydra: its values cannot hold a bare `=`).
    `lines`: the input lines `texts` were split from, where that is known."""
    baseline = cfg.baseline()
    runs = [
        MethodRun(
            cfg.compare,
            make_generator(baseline, generator.model, None, tokenizer.vocab_info, cfg.hardware),
        ),  # type: ignore[arg-type]
        MethodRun(cfg.decoding.name, generator),
    ]
    run_side_by_side(
        runs, tokenizer, texts, cfg.task.src_lang, cfg.task.tgt_lang, batch_size=1,
        desc=f"compare={cfg.compare}, one at a time",
    )  # fmt: skip
    base, ours = runs
    same = sum(a == b for a, b in zip(base.outputs, ours.outputs, strict=True))
    line = (
        f"{ours.name}: {base.total_seconds / ours.total_seconds:.2f}× the speed of "
        f"{base.name} ({ours.total_seconds:.2f} s vs {base.total_seconds:.2f} s for "
        f"{counted(len(texts), 'sentence')}{_pieces_of(lines, len(texts))}, one at a time"
        f"{_on_target(cfg.hardware.target_precision)}); identical outputs: {same}/{len(texts)}"
    )
    if ours.stats.target_passes:
        line += f"; τ {ours.stats.tau:.2f} steps per target pass"
    if ours.stats.plain_sources:
        line += (
            f"; {ours.stats.plain_sources}/{len(texts)} sentences ran plain beam search "
            "(the planner priced speculation slower on this machine)"
        )
    return line


def _on_target(precision: str) -> str:
    """Both decodings run on the same target: a quantized one is named, lest identical
    outputs read as identical to the float32 model's."""
    return "" if precision == "float32" else f", both on the {precision} target"


def _pieces_of(lines: int | None, sentences: int) -> str:
    """Where split lines made more sentences than lines: how many lines they came from."""
    return "" if lines is None or lines == sentences else f" from {counted(lines, 'line')}"


def translate_chunk(
    cfg: TranslateConfig,
    tokenizer: Tokenizer,
    generator: Seq2SeqGenerator,
    splitter: Splitter,
    lines: list[str],
    begin: int,
    line_offset: int,
    *,
    written: int = 0,
    finished: Collection[int] = frozenset(),
    finished_pieces: Mapping[tuple[int, int], dict] | None = None,
    on_line: Callable[[int, str, dict], None] | None = None,
    on_piece: Callable[[int, int, dict], None] | None = None,
) -> tuple[list[str], list[dict]]:
    """Translates lines [begin, begin + chunk_lines): output lines (in
    `cfg.output_format`) and per-line records (numbered in the whole input: these lines
    start after `line_offset` lines). The pieces of all lines go to `translate_batches`
    together, so that split lines share batches; a chunk's batches, and so its output,
    do not depend on how much of it an interrupted run wrote.

    Batches go in the order of the first line they hold, so that lines finish as nearly
    in order as length-sorted batches allow; `on_line(i, output line, record)` is called
    as line i finishes. The first `written` lines and the lines `finished` (an interrupted
    run's) are not wanted: batches of theirs alone are skipped, and they get no call (nor
    a return value). So are the pieces `finished_pieces` ((line, piece) -> its `nbest`
    and `record`, as `on_piece(i, j, kept)` gave them as piece j of split line i finished
    before the line did): their line takes them as they are."""
    chunk = lines[begin : begin + cfg.chunk_lines]
    todo = [i for i, line in enumerate(chunk) if line.strip()]  # blank lines stay blank
    splits = [splitter(chunk[i]) for i in todo]
    pieces, starts = flatten(splits)
    owner = [k for k, s in enumerate(splits) for _ in s.pieces]  # piece -> index in todo
    number = [line_offset + begin + i + 1 for i in todo]  # index in todo -> line number
    seconds: list[float] = []  # per batch
    decoded: list[dict] = [{} for _ in pieces]  # per piece: its batch and search counts
    translations: list[list[Translation]] = [[] for _ in pieces]
    left = [b - a for a, b in zip(starts, starts[1:], strict=False)]  # pieces still to decode
    texts = [""] * len(chunk)
    records = [{"line": line_offset + begin + i + 1, "blank": True} for i in range(len(chunk))]
    objects = [line_object(r, "", [], []) for r in records]

    def output(i: int) -> str:
        return (
            json.dumps(objects[i], ensure_ascii=False) if cfg.output_format == "jsonl" else texts[i]
        )

    def done(i: int) -> bool:
        return i < written or i in finished

    def key(p: int) -> tuple[int, int]:  # (line in the chunk, piece in the line)
        return todo[owner[p]], p - starts[owner[p]]

    kept = finished_pieces or {}
    have = [done(todo[owner[p]]) or key(p) in kept for p in range(len(pieces))]

    def order(batches: list[list[int]]) -> list[list[int]]:
        wanted = [b for b in batches if not all(have[p] for p in b)]
        return sorted(wanted, key=lambda b: min(todo[owner[p]] for p in b))

    def finish(k: int) -> None:
        i, a, b = todo[k], starts[k], starts[k + 1]
        texts[i] = join([h[0].text for h in translations[a:b]])
        records[i] = line_record(number[k], splits[k], decoded[a:b])
        objects[i] = line_object(records[i], texts[i], splits[k].pieces, translations[a:b])
        if on_line is not None:
            on_line(i, output(i), records[i])

    def on_truncate(indices: list[int]) -> None:
        cut = sorted({owner[p] for p in indices})
        numbers = ", ".join(str(number[k]) for k in cut)
        what = f"line {numbers} exceeds" if len(cut) == 1 else f"lines {numbers} exceed"
        limit = generator.model.max_source_seq_len
        log.warning("%s the model's %d source tokens; translated the first %d", what, limit, limit)

    for i in range(written, len(chunk)):
        if on_line is not None and not chunk[i].strip() and not done(i):
            on_line(i, output(i), records[i])
    restored = [p for p in range(len(pieces)) if not done(key(p)[0]) and key(p) in kept]
    for p in restored:
        piece = kept[key(p)]
        translations[p] = [Translation(**t) for t in piece["nbest"]]
        decoded[p] = {**piece["record"], "batch": f"before {piece['record']['batch']}"}
        left[owner[p]] -= 1
    for k in sorted({owner[p] for p in restored}):
        if not left[k]:  # interrupted between its last piece and the line itself
            finish(k)
    last = time.perf_counter()
    for batch, result, hyps in translate_batches(
        generator, tokenizer, pieces, cfg.task.src_lang, cfg.task.tgt_lang, nbest=cfg.nbest,
        max_tokens=cfg.hardware.batch_tokens, on_truncate=on_truncate, order=order,
    ):  # fmt: skip
        now = time.perf_counter()
        seconds.append(now - last)
        last = now
        for row, p in enumerate(batch):
            if have[p]:  # a finished line's, or kept from the interrupted run
                continue
            translations[p] = hyps[row]
            decoded[p] = piece_record(len(seconds) - 1, seconds[-1], len(batch), result, row)
            left[owner[p]] -= 1
            if on_piece is not None and left[owner[p]]:
                nbest = [dataclasses.asdict(t) for t in translations[p]]
                on_piece(*key(p), {"nbest": nbest, "record": decoded[p]})
        for k in sorted({owner[p] for p in batch if not have[p]}):
            if not left[k]:
                finish(k)
    return [output(i) for i in range(len(chunk))], records


def piece_record(
    batch: int, seconds: float, size: int, result: SequenceGeneratorOutput, row: int
) -> dict:
    """A decoded piece's batch (its index and time) and, where speculation ran on it, its
    search counts."""
    piece: dict = {"batch": batch, "seconds": seconds, "batch_size": size}
    if isinstance(result, SpeculativeGeneratorOutput):
        if result.stats.plain_sources:  # a batch that ran plain beam search
            piece["plain"] = True
        else:
            piece["target_passes"] = result.stats.passes_per_source[row]
            piece["steps"] = result.stats.steps_per_source[row]
    else:  # a decoding without a draft
        piece["plain"] = True
    return piece


def line_object(
    record: dict, text: str, pieces: list[str], translations: list[list[Translation]]
) -> dict:
    """output_format=jsonl's object for one input line: `text`, the line as text output
    writes it; `nbest`, whole-line translations with their scores, best first; `stats`,
    the line's stats_file record (`plain`, or `target_passes`, `steps` and `tau`). A
    split line's pieces are decoded apart, so no whole-line alternatives or score exist:
    its `nbest` is the joined 1-best alone, score null, and `pieces` has each piece's
    source and its own n-best list. A blank line: text "", nbest []."""
    stats = {k: v for k, v in record.items() if k != "line"}
    obj: dict = {"line": record["line"], "text": text, "nbest": [], "stats": stats}
    if len(pieces) == 1:
        obj["nbest"] = [dataclasses.asdict(t) for t in translations[0]]
    elif pieces:
        obj["nbest"] = [{"text": text, "score": None}]
        obj["pieces"] = [
            {"source": piece, "nbest": [dataclasses.asdict(t) for t in hyps]}
            for piece, hyps in zip(pieces, translations, strict=True)
        ]
    return obj


def line_record(line: int, split: Split, pieces: list[dict]) -> dict:
    """A line's statistics over its pieces: the largest batch that held one, the time of
    all those batches, and the speculative search counts summed."""
    batches = {p["batch"]: p["seconds"] for p in pieces}
    record: dict = {
        "line": line,
        "batch_size": max(p["batch_size"] for p in pieces),
        "batch_seconds": sum(batches.values()),
    }
    if any("plain" in p for p in pieces):
        record["plain"] = True
    if speculative := [p for p in pieces if "target_passes" in p]:
        passes = sum(p["target_passes"] for p in speculative)
        steps = sum(p["steps"] for p in speculative)
        record.update(target_passes=passes, steps=steps, tau=steps / max(passes, 1))
    if len(split.pieces) > 1:
        record.update(pieces=len(split.pieces), cut_without_boundary=split.cut_without_boundary)
    return record


@hydra.main(version_base=None, config_path=str(SHIPPED / "conf"), config_name="translate")
def main(cfg: TranslateConfig) -> None:
    run_app(translate, cfg)


def cli() -> None:
    """The command line (`app.before_hydra`)."""
    before_hydra(sys.argv[1:], "translate", __doc__)
    main()
