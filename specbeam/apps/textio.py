"""Line-exact text input and resumable, atomic text output for long translation jobs."""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import select
import signal
import stat
import sys
import threading
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from itertools import accumulate
from pathlib import Path
from typing import TextIO


class UnreadableInput(ValueError):
    """A line that is not UTF-8 text (with input_errors=strict); `lines` are the ones before it,
    which a job translates and writes before it stops, and `count` all the input's lines."""

    def __init__(self, message: str, lines: list[str], count: int | None = None) -> None:
        super().__init__(message)
        self.lines, self.count = lines, count


def read_input(path: str) -> bytes:
    """An input file's bytes, read once: its lines and its digest (`input_digest`) must
    describe the same content."""
    try:
        return Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read input {path}: {error.strerror}") from None


def split_lines(data: bytes, path: str, errors: str = "strict") -> list[str]:
    """The lines of file `path`'s bytes, separated by '\\n' only (a stray '\\r' or U+2028
    does not split a line), so the output has exactly one line per input line; a leading
    byte order mark is not text. Invalid UTF-8 or a NUL byte names its line
    (`UnreadableInput`)."""
    _check_errors(errors)
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    starts = accumulate((len(line) + 1 for line in lines), initial=0)
    decoded: list[str] = []
    try:
        for number, (line, start) in enumerate(zip(lines, starts, strict=False), start=1):
            decoded.append(_decode(line, path, number, errors, start))
    except UnreadableInput as error:
        error.lines, error.count = _without_bom(decoded), len(lines)
        raise
    return _without_bom(decoded)


def stream_lines(fd: int, errors: str, max_lines: int) -> Iterator[list[str]]:
    """The lines of a pipe or terminal (as `split_lines` splits and decodes them) as they
    arrive: each time at least one complete line is there, the complete lines that can
    be read without waiting, up to `max_lines`. So a filter answers each line typed or
    sent alone at once, and batches fill up when the input comes faster than it is
    translated; no timer to tune. The last line may lack its '\\n'. Invalid UTF-8:
    the lines before it come first, then `UnreadableInput`."""
    _check_errors(errors)
    pending = bytearray()
    number = 0
    ended = False
    while True:
        while not ended and (
            b"\n" not in pending or (pending.count(b"\n") < max_lines and _readable(fd))
        ):
            data = os.read(fd, 1 << 16)
            ended = not data
            pending += data
        if ended and pending and not pending.endswith(b"\n"):
            pending += b"\n"
        if not pending:
            return
        *complete, rest = pending.split(b"\n", max_lines)  # the rest may hold more lines
        pending = bytearray(rest)
        decoded: list[str] = []
        unreadable: UnreadableInput | None = None
        try:
            for line in complete:
                decoded.append(_decode(line, "<stdin>", number + len(decoded) + 1, errors))
        except UnreadableInput as error:
            unreadable = error
        if decoded:
            yield decoded if number else _without_bom(decoded)
        if unreadable is not None:
            raise unreadable
        number += len(complete)


def _without_bom(lines: list[str]) -> list[str]:
    """A UTF-8 byte order mark opening the first line is an encoding marker, not text."""
    if lines and lines[0].startswith("\ufeff"):
        lines[0] = lines[0][1:]
    return lines


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def _check_errors(errors: str) -> None:
    if errors not in ("strict", "replace"):
        raise ValueError(f"input_errors={errors} is invalid: allowed: strict, replace")


def _decode(line: bytes, path: str, number: int, errors: str, start: int | None = None) -> str:
    try:
        text = line.decode("utf-8", errors=errors)
    except UnicodeDecodeError as error:
        bom = number == 1 and line.startswith((b"\xff\xfe", b"\xfe\xff"))
        why = ": a UTF-16 byte order mark (convert the input to UTF-8)" if bom else ""
        raise _unreadable(path, number, "invalid UTF-8", error.start, start, why) from None
    if "\0" in text:  # valid UTF-8, but no text has it: UTF-16 without a BOM, a binary file
        if errors != "replace":
            raise _unreadable(
                path, number, "a NUL byte", line.index(b"\0"), start,
                ", which no text has (UTF-16? convert the input to UTF-8)",
            )  # fmt: skip
        text = text.replace("\0", "\ufffd")
    return text.removesuffix("\r")


def _unreadable(
    path: str, number: int, problem: str, at: int, start: int | None, why: str = ""
) -> UnreadableInput:
    """`problem` at offset `at` of line `number`, which starts at offset `start` of the
    file (None: a stream); bytes are counted from 1, as lines are."""
    where = "" if start is None else f" (byte {start + at + 1} of the file)"
    return UnreadableInput(
        f"{path}:{number}: {problem} at byte {at + 1} of the line{where}{why}; "
        "set input_errors=replace to translate it with U+FFFD in place",
        [],
    )


class ResumableOutput:
    """Writes lines to `<output>.partial`, flushed chunk by chunk, and renames it to
    `<output>` when complete, so a partial file never looks complete. A rerun with the
    same output path continues after the last complete line, and takes the lines an
    interrupted run finished beyond it (`ahead`, kept in `<output>.partial.ahead`). A
    symlink is followed (the partial file lies beside its target); an existing file that
    is not a regular one (a FIFO, a device, /dev/stdout) and stdout (-) are written
    straight through: nothing to rename, so nothing to resume (`partial` is None).

    With `record` (a shard), the finished file gets `job` and its line count beside it
    (`finished_record`), so that merge_shards can tell shards of different runs apart; a
    run that starts or resumes the file removes an older run's record first."""

    def __init__(self, path: str, job: dict, record: bool = False, setting: str = "output") -> None:
        """`setting`: what errors call the file (`stats_file`)."""
        self.stream: TextIO
        self.setting = setting
        self.done = 0
        self.ahead: dict[int, tuple[str, dict]] = {}  # line index -> (output line, record)
        # (line index, piece index) -> a finished piece of an unfinished split line
        self.pieces_ahead: dict[tuple[int, int], dict] = {}
        self.name = "stdout" if path == "-" else path
        self.partial: Path | None = None
        self.resumed = False
        self.job = job
        self.record: Path | None = None
        if path == "-":
            self.stream = sys.stdout
            return
        if _special(path):
            self.stream = _open(path, f"{setting} {path}", "a")  # what a shell sent there stays
            return
        self.path = Path(os.path.realpath(path))
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.sidecar = self.path.with_name(self.path.name + ".partial.json")
        self.ahead_path = self.path.with_name(self.path.name + ".partial.ahead")
        self.input_log = self.path.with_name(self.path.name + ".partial.input")  # `InputLog`
        if record:
            self.record = finished_record(self.path)
        resumed = self.resumed = self.partial.exists()
        self.stream = _open(self.partial, f"{setting} {path}", "a")
        try:  # two jobs appending to one file would interleave their lines
            fcntl.flock(self.stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.stream.close()
            raise ValueError(
                f"{self.partial} is being written by another running job; wait for it to "
                "finish or choose another output path"
            ) from None
        # A run that failed before its first line left nothing to resume: another job may
        # take its partial file (the corrected command).
        if resumed and not self.partial.stat().st_size and not self.ahead_path.exists():
            resumed = self.resumed = False
        if resumed:
            try:
                self._check_same_job(job)
                self.done = _truncate_to_complete_lines(self.partial)
                self.ahead, self.pieces_ahead = _read_ahead(self.ahead_path, self.done)
            except ValueError:
                self.stream.close()
                raise
        else:
            self._drop_ahead()  # an older job's
        if self.record is not None:  # an older run's: it would vouch for this run's file
            self.record.unlink(missing_ok=True)
            _temporary(self.record).unlink(missing_ok=True)
        try:
            self.sidecar.write_text(json.dumps(job) + "\n")
        except OSError as error:
            raise ValueError(f"cannot write {setting} {path}: {error.strerror}") from None

    def _check_same_job(self, job: dict) -> None:
        """The same input bytes and settings; the input's path may be spelt another way
        (relative, from another directory)."""
        previous = json.loads(self.sidecar.read_text()) if self.sidecar.exists() else {}
        differ = job_differences(previous, job)
        if differ:
            raise ValueError(
                f"{self.partial} holds a partial output of a different job ({', '.join(differ)}); "
                "delete it or choose another output path"
            )

    def truncate_to(self, count: int) -> None:
        """Drops lines beyond `count` (a companion file written ahead of the output)."""
        if self.partial is None or self.done <= count:
            return
        self.stream.flush()
        data = self.partial.read_bytes()
        end = 0
        for _ in range(count):
            end = data.index(b"\n", end) + 1
        os.ftruncate(self.stream.fileno(), end)  # the same descriptor: the lock is kept
        self.done = count

    def write(self, lines: list[str]) -> None:
        with uninterrupted():  # `done` counts the lines out, to the end of the last
            try:
                self.stream.writelines(line + "\n" for line in lines)
                self.stream.flush()
                if self.partial is not None:
                    os.fsync(self.stream.fileno())
            except OSError as error:
                raise ValueError(
                    f"cannot write {self.setting} {self.name}: {error.strerror}"
                ) from None
            self.done += len(lines)

    def keep_ahead(
        self, lines: dict[int, tuple[str, dict]], pieces: dict[tuple[int, int], dict] | None = None
    ) -> None:
        """Keeps the lines finished beyond `done` (index -> (output line, record)) for a
        rerun: out-of-order lines an interrupted run would otherwise decode again; and the
        finished pieces of split lines that are not (`pieces`: (line index, piece index) ->
        the piece's translations and record), whose batches the rerun would decode again."""
        if self.partial is None:
            return
        pieces = pieces or {}
        with uninterrupted():
            if not lines and not pieces:
                self.ahead_path.unlink(missing_ok=True)
                return
            rows = [
                {"index": i, "text": text, "record": record}
                for i, (text, record) in sorted(lines.items())
            ]
            rows += [{"index": i, "piece": j, **kept} for (i, j), kept in sorted(pieces.items())]
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
            _write_atomically(self.ahead_path, text)

    def finish(self) -> None:
        """Renames the complete partial file to the output; a shard's record is written
        first, so a finished shard never lacks it (a kill in between leaves the partial
        file, which merge_shards refuses and the rerun completes)."""
        if self.partial is None:
            self.close()
            return
        self.stream.close()
        if self.record is not None:
            record = {**self.job, "lines": self.done}
            _write_atomically(self.record, json.dumps(record, indent=1, ensure_ascii=False) + "\n")
        os.replace(self.partial, self.path)
        self.sidecar.unlink()
        self._drop_ahead()
        self.input_log.unlink(missing_ok=True)

    def abandon(self) -> None:
        """Closes a file refused or failed before anything was written: a partial file this
        run created (or an empty one it found), and its companions, go, so that nothing
        stays behind to resume."""
        self.close()
        if self.partial is not None and not self.resumed:
            self.partial.unlink(missing_ok=True)
            self.sidecar.unlink(missing_ok=True)
            self.input_log.unlink(missing_ok=True)
            self._drop_ahead()

    def _drop_ahead(self) -> None:
        """Removes the ahead file and a temporary one a killed write left."""
        self.ahead_path.unlink(missing_ok=True)
        _temporary(self.ahead_path).unlink(missing_ok=True)

    def close(self) -> None:
        if self.stream is not sys.stdout and not self.stream.closed:
            try:
                self.stream.close()
            except OSError:  # its unflushed lines were reported by `write`
                pass


@contextmanager
def uninterrupted() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM wait until the block is done: output written, and
    counted, whole. (A signal mask would not do: another thread, torch's or tqdm's, takes
    the signal.)"""
    if threading.current_thread() is not threading.main_thread():  # signals go to main
        yield
        return
    caught: list[int] = []
    held = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda number, _: caught.append(number)) for s in held}
    try:
        yield
    finally:
        for held_signal, handler in previous.items():
            signal.signal(held_signal, handler)
        if caught:
            signal.raise_signal(caught[0])


def _special(path: str) -> bool:
    """Whether `path` exists and is not a regular file (after symlinks), or is in /dev or
    /proc: /dev/stdout is a regular file when the shell redirects it to one (`> out.en`,
    `>> log`), and that file must be written through the shell's descriptor."""
    if os.path.abspath(path).startswith(("/dev/", "/proc/")):
        return True
    try:
        return not stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _open(path: Path | str, output: str, mode: str) -> TextIO:
    """`path` opened for `output` (the setting and the path it names), or a one-line error
    naming both."""
    try:
        return open(path, mode, encoding="utf-8")
    except OSError as error:
        via = "" if output.endswith(f" {path}") else f": cannot create {path}"
        raise ValueError(f"cannot write {output}{via}: {error.strerror}") from None


def _temporary(path: Path) -> Path:
    """Where `_write_atomically` writes `path` before renaming it."""
    return path.with_name(path.name + ".tmp")


def _write_atomically(path: Path, text: str) -> None:
    """`path` holds `text` whole or not at all (old content, or none), whenever a kill comes."""
    temporary = _temporary(path)
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    except OSError as error:
        raise ValueError(f"cannot write {path}: {error.strerror}") from None


def _truncate_to_complete_lines(path: Path) -> int:
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    return data.count(b"\n", 0, end)


def _read_ahead(
    path: Path, done: int
) -> tuple[dict[int, tuple[str, dict]], dict[tuple[int, int], dict]]:
    """The lines and pieces `ResumableOutput.keep_ahead` kept, beyond the `done` lines out
    already."""
    ahead: dict[int, tuple[str, dict]] = {}
    pieces: dict[tuple[int, int], dict] = {}
    if not path.exists():
        return ahead, pieces
    for number, row in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            kept = json.loads(row)
            index, record = int(kept["index"]), dict(kept["record"])
            if "piece" in kept:
                piece = {"nbest": list(kept["nbest"]), "record": record}
                if index >= done:
                    pieces[index, int(kept["piece"])] = piece
            elif index >= done:
                ahead[index] = (str(kept["text"]), record)
        except (ValueError, KeyError, TypeError):
            raise ValueError(
                f"{path}:{number}: not a line specbeam kept; delete the file to translate "
                "those lines again"
            ) from None
    return ahead, pieces


def input_digest(data: bytes) -> str:
    """The digest of an input's bytes: an input edited (or replaced) since is another input."""
    return hashlib.sha256(data).hexdigest()


def job_fingerprint(input_path: str, digest: str, settings: dict[str, object]) -> dict:
    """What must match for a rerun to continue a partial output, and for shards to join
    into one output: the input's bytes (`digest`; "stdin" for -) and the settings, each
    under its own name (a config's fields as `decoding.beam_size`) so that a difference
    can be named."""
    named: dict[str, object] = {}
    for name, value in settings.items():
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            named.update({f"{name}.{k}": v for k, v in dataclasses.asdict(value).items()})
        else:
            named[name] = value
    settings_as_read = json.loads(json.dumps(named, default=str))  # tuples become lists
    return {"input": input_path, "input_sha256": digest, "settings": settings_as_read}


def job_differences(ours: dict, theirs: dict) -> list[str]:
    """What differs between two `job_fingerprint`s, each named: the input's bytes, then
    each setting (the input's path is not compared: the same file may be named otherwise)."""
    differ = []
    if ours.get("input_sha256") != theirs.get("input_sha256"):
        differ.append(f"input {ours.get('input')} vs {theirs.get('input')}, other bytes")
    a, b = ours.get("settings", {}), theirs.get("settings", {})
    if not isinstance(a, dict) or not isinstance(b, dict):  # an older specbeam's record
        return differ + ([] if a == b else ["settings recorded by another specbeam version"])
    return differ + setting_differences(a, b)


def setting_differences(ours: dict, theirs: dict, skip: Collection[str] = ()) -> list[str]:
    """Each setting (by name) whose values differ, as `name ours vs theirs`; where two
    configs of a group differ by name (`decoding.name`), the group alone (`decoding
    spec_beam vs greedy`), not each of its settings."""
    names = [n for n in {**ours, **theirs} if n not in skip and ours.get(n) != theirs.get(n)]
    groups = {n.removesuffix(".name") for n in names if n.endswith(".name")}
    return [
        f"{name.removesuffix('.name')} {_shown(ours.get(name))} vs {_shown(theirs.get(name))}"
        for name in names
        if name.endswith(".name") or name.rsplit(".", 1)[0] not in groups
    ]


def _shown(value: object) -> str:
    """A setting's value as the command line spells it (a string bare, others as JSON)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class InputLog:
    """Digests of standard input's lines as they are read, beside a partial output
    (`<output>.partial.input`: line i's at byte 17·i, 16 hex digits and a newline). A file
    input's bytes are in the job's digest; a rerun from stdin reads a stream that may carry
    another text, so each line that has output already (written, or kept ahead) must be
    the line it was translated from: a rerun that differs there is refused, naming the
    line, before that output is used. Other lines' digests are overwritten as they are read."""

    WIDTH = 17

    def __init__(self, out: ResumableOutput) -> None:
        assert out.partial is not None
        self.out, self.path = out, out.input_log
        self.translated = {*range(out.done), *out.ahead}  # lines with output, as resumed
        self.logged: list[str] = []
        if self.translated:
            if not self.path.exists():
                raise ValueError(
                    f"{out.partial} was translated from standard input by an older specbeam, "
                    "which kept no record of its lines: delete it to translate from the start"
                )
            self.logged = self.path.read_text(encoding="ascii").split()
        try:
            self.fd = os.open(
                self.path, os.O_RDWR | os.O_CREAT | (0 if self.translated else os.O_TRUNC)
            )
        except OSError as error:
            raise ValueError(f"cannot write {self.path}: {error.strerror}") from None
        self.count = 0  # lines read

    def checked(self, chunks: Iterable[list[str]]) -> Iterator[list[str]]:
        """The chunks read from stdin, each checked and logged before it is translated."""
        for lines in chunks:
            digests = [hashlib.sha256(line.encode()).hexdigest()[:16] for line in lines]
            for i, digest in enumerate(digests, start=self.count):
                if i in self.translated and self.logged[i : i + 1] != [digest]:
                    raise ValueError(
                        f"line {i + 1} of standard input is not the line {self.out.partial} "
                        "was translated from: this is another input; give the same input, or "
                        "delete the partial file to translate this one from the start"
                    )
            record = "".join(d + "\n" for d in digests).encode()
            os.pwrite(self.fd, record, self.WIDTH * self.count)
            os.fsync(self.fd)
            self.count += len(lines)
            yield lines

    def close(self) -> None:
        os.close(self.fd)


def finished_record(path: str | Path) -> Path:
    """Where the record of a finished shard lies: `<file>.json` beside the file (beside
    the target of a symlink, as its partial file is)."""
    real = Path(os.path.realpath(path))
    return real.with_name(real.name + ".json")
