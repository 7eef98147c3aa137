"""Line-exact input and resumable output."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from specbeam.apps.textio import (
    InputLog,
    ResumableOutput,
    UnreadableInput,
    read_input,
    setting_differences,
    split_lines,
    stream_lines,
    uninterrupted,
)


def read_lines(path: str, errors: str = "strict") -> list[str]:
    """A file's lines as translate reads them: its bytes once, then split."""
    return split_lines(read_input(path), path, errors)


def test_lines_split_on_newline_only(tmp_path) -> None:
    path = tmp_path / "in.txt"
    path.write_bytes("a\r\nb\u2028c\x0bd\n\ne\n".encode())
    assert read_lines(str(path)) == ["a", "b\u2028c\x0bd", "", "e"]


def test_invalid_utf8_names_line_and_byte(tmp_path) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nabc\xffdef\n")
    with pytest.raises(
        ValueError, match=r"bad.txt:2: invalid UTF-8 at byte 4 of the line \(byte 7 of the file\)"
    ):
        read_lines(str(path))
    assert read_lines(str(path), errors="replace") == ["ok", "abc\ufffddef"]


def test_a_utf16_byte_order_mark_is_named(tmp_path) -> None:
    path = tmp_path / "utf16.txt"
    path.write_bytes("Hola.\n".encode("utf-16"))  # with its byte order mark
    message = r"^.*utf16.txt:1: invalid UTF-8 at byte 1 of the line \(byte 1 of the file\): a UTF-16 byte order mark \(convert the input to UTF-8\); set"
    with pytest.raises(UnreadableInput, match=message):
        read_lines(str(path))


def test_invalid_utf8_keeps_the_lines_before_it(tmp_path) -> None:
    """A job translates and writes them before it stops."""
    path = tmp_path / "bad.txt"
    path.write_bytes(b"ok\nfine\nabc\xffdef\nlast\n")
    with pytest.raises(UnreadableInput) as error:
        read_lines(str(path))
    assert error.value.lines == ["ok", "fine"] and error.value.count == 4


def test_a_nul_byte_names_its_line_and_keeps_the_lines_before_it(tmp_path) -> None:
    """Valid UTF-8, but no text has one: UTF-16 read as UTF-8 is full of them."""
    path = tmp_path / "utf16.txt"
    path.write_bytes(b"ok\n" + "Hola.\n".encode("utf-16-le"))
    with pytest.raises(UnreadableInput, match=r"^.*utf16.txt:2: a NUL byte at byte 2 of the line \(byte 5 of the file\), which no text has \(UTF-16\? convert the input to UTF-8\); set input_errors=replace") as error:  # fmt: skip
        read_lines(str(path))
    assert error.value.lines == ["ok"] and error.value.count == 3  # UTF-16's '\n' is "\n\0"
    replaced = ["ok", "H\ufffdo\ufffdl\ufffda\ufffd.\ufffd", "\ufffd"]
    assert read_lines(str(path), errors="replace") == replaced


def test_a_nul_byte_on_stdin_names_its_line() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"ok\na\x00b\n")
    os.close(write_end)
    lines = stream_lines(read_end, "strict", max_lines=10)
    assert next(lines) == ["ok"]
    with pytest.raises(ValueError, match=r"^<stdin>:2: a NUL byte at byte 2 of the line, which"):
        next(lines)
    os.close(read_end)


def test_a_leading_byte_order_mark_is_not_text(tmp_path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffHola.\n\ufeffY\n".encode())
    assert read_lines(str(path)) == ["Hola.", "\ufeffY"]
    read_end, write_end = os.pipe()
    os.write(write_end, "\ufeffHola.\n".encode())
    os.close(write_end)
    assert list(stream_lines(read_end, "strict", max_lines=10)) == [["Hola."]]
    os.close(read_end)


def test_streamed_lines_come_as_they_arrive_in_batches_of_what_is_there() -> None:
    """Each batch: the complete lines readable without waiting, at most max_lines; a line
    still being written waits for its newline; the last may lack one. Split and decoded
    as split_lines does."""
    read_end, write_end = os.pipe()
    try:
        lines = stream_lines(read_end, "replace", max_lines=2)
        os.write(write_end, "a\r\nb\u2028c".encode())
        os.write(write_end, b"\nd\ne\nhalf")
        assert next(lines) == ["a", "b\u2028c"]
        assert next(lines) == ["d", "e"]
        os.write(write_end, b" line\nx")
        signal.alarm(30)  # a batch that waited for max_lines would never come
        assert next(lines) == ["half line"]
        signal.alarm(0)
        os.write(write_end, b"\n\n\xff")
        assert next(lines) == ["x", ""]
        os.close(write_end)
        write_end = -1
        assert list(lines) == [["\ufffd"]]
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)


def test_invalid_utf8_on_stdin_names_its_line_after_the_lines_before_it() -> None:
    """The valid lines read with the bad one come first: the job translates them."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"ok\n\nab\xff\nnever\n")
    os.close(write_end)
    lines = stream_lines(read_end, "strict", max_lines=10)
    assert next(lines) == ["ok", ""]
    with pytest.raises(ValueError, match=r"^<stdin>:3: invalid UTF-8 at byte 3 of the line; set"):
        next(lines)
    os.close(read_end)


def test_missing_input_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="cannot read input .*nope.txt"):
        read_lines(str(tmp_path / "nope.txt"))


def test_partial_output_resumes_and_completes_atomically(tmp_path) -> None:
    target = tmp_path / "out.txt"
    job = {"input": "x", "input_sha256": "1", "settings": {"s": "y"}}
    first = ResumableOutput(str(target), job)
    first.write(["one", "two"])
    first.stream.write("thr")  # a write cut short by a kill
    first.close()
    assert not target.exists()
    second = ResumableOutput(str(target), job)
    assert second.done == 2
    second.write(["three"])
    second.finish()
    assert target.read_text() == "one\ntwo\nthree\n"
    assert not (tmp_path / "out.txt.partial").exists()


def test_lines_kept_ahead_come_back_to_the_rerun_and_go_with_the_finished_file(tmp_path) -> None:
    """An interrupted run's lines finished beyond its written ones: a rerun of the same job
    gets those it has not written yet; a new job (no partial output) none."""
    target = tmp_path / "out.txt"
    job = {"input": "x"}
    first = ResumableOutput(str(target), job)
    first.write(["one"])
    first.keep_ahead({2: ("three", {"line": 3}), 4: ("fünf", {"line": 5})})
    first.close()
    second = ResumableOutput(str(target), job)
    assert second.done == 1 and second.ahead == {
        2: ("three", {"line": 3}),
        4: ("fünf", {"line": 5}),
    }
    second.write(["two", "three", "four"])
    second.close()
    third = ResumableOutput(str(target), job)
    assert third.done == 4 and third.ahead == {4: ("fünf", {"line": 5})}
    third.write(["fünf"])
    third.finish()
    assert not (tmp_path / "out.txt.partial.ahead").exists()
    ResumableOutput(str(tmp_path / "new.txt"), job).keep_ahead({3: ("x", {})})
    (tmp_path / "new.txt.partial").unlink()
    assert ResumableOutput(str(tmp_path / "new.txt"), job).ahead == {}


def test_pieces_kept_ahead_come_back_until_their_line_is_written(tmp_path) -> None:
    """Finished pieces of split lines an interrupted run had not finished, beside its
    later lines, in the same file."""
    target, job = tmp_path / "out.txt", {"input": "x"}
    piece = {"nbest": [{"text": "Dos.", "score": -0.5}], "record": {"batch": 3}}
    first = ResumableOutput(str(target), job)
    first.write(["one"])
    first.keep_ahead({3: ("four", {"line": 4})}, {(1, 0): piece, (2, 2): piece})
    first.close()
    second = ResumableOutput(str(target), job)
    assert second.ahead == {3: ("four", {"line": 4})}
    assert second.pieces_ahead == {(1, 0): piece, (2, 2): piece}
    second.write(["two"])
    second.keep_ahead({}, {(2, 2): piece})
    second.close()
    third = ResumableOutput(str(target), job)
    assert third.ahead == {} and third.pieces_ahead == {(2, 2): piece}
    third.write(["three"])
    third.close()
    assert ResumableOutput(str(target), job).pieces_ahead == {}  # its line is out


def test_a_damaged_file_of_lines_kept_ahead_is_named_with_its_line(tmp_path) -> None:
    target = tmp_path / "out.txt"
    job = {"input": "x"}
    first = ResumableOutput(str(target), job)
    first.keep_ahead({0: ("one", {})})
    first.close()
    ahead = tmp_path / "out.txt.partial.ahead"
    ahead.write_text(ahead.read_text() + '{"index": 1, "text": "tw\n')
    with pytest.raises(ValueError, match=rf"^{ahead}:2: not a line specbeam kept; delete the file"):
        ResumableOutput(str(target), job)


def test_a_write_of_lines_ahead_cut_short_by_a_kill_leaves_nothing_behind(tmp_path) -> None:
    """A kill inside `keep_ahead`'s write leaves its temporary file; the finished output
    takes it away with the rest."""
    target = tmp_path / "out.txt"
    job = {"input": "x"}
    first = ResumableOutput(str(target), job)
    first.write(["one"])
    first.close()
    (tmp_path / "out.txt.partial.ahead.tmp").write_text('{"index": 3, "te')
    second = ResumableOutput(str(target), job)
    assert second.done == 1 and second.ahead == {}
    second.write(["two"])
    second.finish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_partial_output_of_another_job_is_refused_naming_what_differs(tmp_path) -> None:
    """Other bytes or other settings are another job; the same bytes named by another
    path (relative, from another directory) are the same job."""
    target = tmp_path / "out.txt"
    job = {"input": "a.es", "input_sha256": "1", "settings": {"nbest": 1, "decoding.gamma": 2}}
    first = ResumableOutput(str(target), job)
    first.write(["one"])
    first.close()
    other_bytes = {**job, "input_sha256": "2"}
    with pytest.raises(ValueError) as error:
        ResumableOutput(str(target), other_bytes)
    assert str(error.value) == (
        f"{target}.partial holds a partial output of a different job (input a.es vs a.es, "
        "other bytes); delete it or choose another output path"
    )
    other_settings = {**job, "settings": {"nbest": 1, "decoding.gamma": 3}}
    with pytest.raises(ValueError, match=r"different job \(decoding.gamma 2 vs 3\)"):
        ResumableOutput(str(target), other_settings)
    # Another decoding altogether: named once, not by each of its settings.
    ours = {"decoding.name": "spec_beam", "decoding.gamma": 2, "nbest": 1}
    theirs = {"decoding.name": "greedy", "decoding.gamma": 4, "nbest": 2}
    assert setting_differences(ours, theirs) == ["decoding spec_beam vs greedy", "nbest 1 vs 2"]
    ResumableOutput(str(target), {**job, "input": "/somewhere/else/a.es"}).finish()


def test_a_partial_output_with_no_lines_blocks_nothing(tmp_path) -> None:
    """A run that failed before its first line (an unreadable input) leaves nothing to
    resume: the corrected command, another job, starts afresh; abandoning it leaves nothing."""
    target = tmp_path / "o.en"
    ResumableOutput(str(target), {"input": "/bin/ls", "input_sha256": "1"}).close()
    corrected = ResumableOutput(str(target), {"input": "a.es", "input_sha256": "2"})
    assert not corrected.resumed and corrected.done == 0
    corrected.abandon()
    assert list(tmp_path.iterdir()) == []


def _resumed(tmp_path: Path, written: list[str], ahead: dict[int, str]) -> ResumableOutput:
    """An output from stdin interrupted after `written` lines, with `ahead` kept."""
    target = tmp_path / "out.txt"
    first = ResumableOutput(str(target), {"input": "-"})
    log = InputLog(first)
    read = [*written, *(f"line {i}" for i in range(len(written), 1 + max(ahead, default=0)))]
    for lines in log.checked([read]):
        first.write(lines[: len(written)])
    first.keep_ahead({i: (text, {}) for i, text in ahead.items()})
    first.close()
    log.close()
    return ResumableOutput(str(target), {"input": "-"})


def test_stdin_lines_with_output_must_be_the_ones_read_before(tmp_path) -> None:
    """A rerun from stdin may be fed another text: the lines the partial output has
    (written, or kept ahead) are checked against the digests logged as they were read;
    the others may differ (they were never translated)."""
    out = _resumed(tmp_path, ["uno", "dos"], {3: "three"})
    log = InputLog(out)
    assert list(log.checked([["uno", "dos"], ["new 2", "line 3", "cinco"]])) == [
        ["uno", "dos"], ["new 2", "line 3", "cinco"],
    ]  # fmt: skip
    log.close()
    out.close()
    for lines, bad in ((["uno", "DOS"], 2), (["uno", "dos", "x", "changed"], 4)):
        out = ResumableOutput(str(tmp_path / "out.txt"), {"input": "-"})
        log = InputLog(out)
        with pytest.raises(ValueError, match=rf"^line {bad} of standard input is not the line"):
            list(log.checked([lines]))
        log.close()
        out.close()


def test_a_stdin_partial_without_a_log_is_refused(tmp_path) -> None:
    """Written by an older specbeam: nothing to check a rerun's lines against."""
    _resumed(tmp_path, ["uno"], {}).close()
    (tmp_path / "out.txt.partial.input").unlink()
    out = ResumableOutput(str(tmp_path / "out.txt"), {"input": "-"})
    with pytest.raises(ValueError, match="kept no record of its lines: delete it"):
        InputLog(out)
    out.close()


def test_a_second_job_writing_the_same_output_is_refused(tmp_path) -> None:
    """Two jobs appending to one partial file would interleave lines: the second is refused
    until the first has finished (or died, which releases its lock)."""
    target = tmp_path / "out.txt"
    job = {"input": "x"}
    first = ResumableOutput(str(target), job)
    first.write(["one"])
    with pytest.raises(
        ValueError, match=r"out.txt.partial is being written by another running job"
    ):
        ResumableOutput(str(target), job)
    first.write(["two", "three"])
    first.truncate_to(2)  # keeps the lock
    with pytest.raises(ValueError, match="another running job"):
        ResumableOutput(str(target), job)
    first.close()  # a killed job releases it: the next run resumes
    second = ResumableOutput(str(target), job)
    assert second.done == 2
    second.finish()
    assert target.read_text() == "one\ntwo\n"


def test_a_symlinked_output_writes_its_target(tmp_path) -> None:
    """The link stays a link; the partial file lies beside the file it points to."""
    (tmp_path / "real").mkdir()
    real = tmp_path / "real" / "out.txt"
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    out = ResumableOutput(str(link), {"input": "x"})
    out.write(["one"])
    assert (tmp_path / "real" / "out.txt.partial").exists()
    assert not (tmp_path / "link.txt.partial").exists()
    out.finish()
    assert link.is_symlink() and real.read_text() == "one\n"


def test_a_fifo_output_is_written_straight_through(tmp_path) -> None:
    """No partial file to rename over it (which would replace the FIFO and leave its
    reader waiting): the lines go to the reader, and the FIFO stays."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.extend(open(fifo).read().splitlines()))
    reader.start()
    out = ResumableOutput(str(fifo), {"input": "x"})
    assert out.partial is None
    out.write(["one", "two"])
    out.finish()
    reader.join(timeout=30)
    assert received == ["one", "two"] and fifo.is_fifo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]


def test_an_output_whose_partial_file_cannot_be_made_names_it(tmp_path) -> None:
    """E.g. /proc/version: the file exists, but nothing can be created beside it."""
    (tmp_path / "a_file").write_text("")
    target = tmp_path / "a_file" / "out.txt"
    with pytest.raises(
        ValueError,
        match=rf"^cannot write output {target}: cannot create {target}.partial: Not a directory$",
    ):
        ResumableOutput(str(target), {"input": "x"})


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
def test_a_device_output_is_written_straight_through_and_its_errors_named() -> None:
    out = ResumableOutput("/dev/full", {"input": "x"})
    with pytest.raises(
        ValueError, match="^cannot write output /dev/full: No space left on device$"
    ):
        out.write(["one"])
    out.close()


def test_ctrl_c_waits_until_a_write_is_whole() -> None:
    """Even with other threads running (torch's, tqdm's), which a signal mask would not
    cover: the block ends, then KeyboardInterrupt. Python's own handler is set first: a
    process started in the background by a shell ignores SIGINT from the start."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    steps = []
    try:
        with pytest.raises(KeyboardInterrupt), uninterrupted():
            os.kill(os.getpid(), signal.SIGINT)
            steps.append("after the signal")
    finally:
        stop.set()
        other.join()
        signal.signal(signal.SIGINT, previous)
    assert steps == ["after the signal"]


def test_dev_stdout_redirected_to_a_file_is_written_through_the_redirection(tmp_path) -> None:
    """`output=/dev/stdout >> log`: appended to, not truncated, replaced or renamed over."""
    log = tmp_path / "log.txt"
    log.write_text("previous\n")
    code = (
        "from specbeam.apps.textio import ResumableOutput\n"
        "out = ResumableOutput('/dev/stdout', {})\nout.write(['one'])\nout.finish()"
    )
    with open(log, "a") as stdout:
        repo = Path(__file__).resolve().parents[2]
        subprocess.run([sys.executable, "-c", code], cwd=repo, stdout=stdout, check=True)
    assert log.read_text() == "previous\none\n"
    assert [p.name for p in tmp_path.iterdir()] == ["log.txt"]


def test_errors_name_the_setting_the_file_is_for(tmp_path) -> None:
    missing = tmp_path / "nodir" / "s.jsonl"
    with pytest.raises(ValueError, match=rf"^cannot write stats_file {missing}: cannot create"):
        ResumableOutput(str(missing), {}, setting="stats_file")
