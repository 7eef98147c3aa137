"""The kernel table: the fastest candidate kept per shape and thread count, measured once,
read back from disk, and measured again (with a notice) where the file is from another CPU."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import torch

from specbeam.kernels import kernel_table
from specbeam.kernels.kernel_table import KernelTable, grid_rows


def test_a_row_count_takes_the_measured_count_at_or_below_it() -> None:
    assert [grid_rows(r) for r in (1, 5, 7, 9, 17, 64, 500)] == [1, 5, 6, 8, 16, 64, 64]


def slow(seconds: float):
    def run(x: torch.Tensor, copy: int) -> torch.Tensor:
        time.sleep(seconds)
        return x

    return run


def counting(calls: list[int]):
    def build(copies: int):
        calls.append(copies)
        return {"fast": slow(0.0), "slow": slow(0.002)}

    return build


NAMES = ("fast", "slow")


def test_the_fastest_is_chosen_once_and_kept_on_disk(tmp_path: Path) -> None:
    path = tmp_path / "products.json"
    weight = torch.zeros(64, 32)
    calls: list[int] = []
    table = KernelTable(path)
    assert table.choose(5, weight, NAMES, counting(calls)) == "fast"
    assert table.choose(5, weight, NAMES, counting(calls)) == "fast"
    assert table.choose(7, weight, NAMES, counting(calls)) == "fast"  # 6 rows: measured
    assert len(calls) == 2
    stored = json.loads(path.read_text())
    assert stored["machine"] == kernel_table.machine()
    key = f"{torch.get_num_threads()} threads, 5 rows, 64x32: fast,slow"
    assert stored["choices"][key] == "fast"
    assert stored["seconds"][key]["slow"] > stored["seconds"][key]["fast"]
    again = KernelTable(path)
    assert again.choose(5, weight, NAMES, counting(calls)) == "fast"
    assert len(calls) == 2  # read back, not measured


def test_a_table_from_another_cpu_is_measured_again_with_a_notice(tmp_path: Path, caplog) -> None:
    path = tmp_path / "products.json"
    key = f"{torch.get_num_threads()} threads, 5 rows, 64x32: fast,slow"
    other = {
        "machine": {"cpu": "another CPU", "torch": torch.__version__},
        "choices": {key: "slow"},
    }
    path.write_text(json.dumps(other))
    calls: list[int] = []
    with caplog.at_level(logging.WARNING):
        table = KernelTable(path)
    assert "was measured on another CPU, torch" in caplog.text
    assert table.choose(5, torch.zeros(64, 32), NAMES, counting(calls)) == "fast"
    assert len(calls) == 1
    assert json.loads(path.read_text())["machine"] == kernel_table.machine()


def test_weights_are_cycled_so_they_stream_from_memory(tmp_path: Path) -> None:
    calls: list[int] = []
    KernelTable(tmp_path / "t.json").choose(1, torch.zeros(512, 512), NAMES, counting(calls))
    assert calls == [8]  # 1 MiB each: the most copies
    KernelTable(tmp_path / "u.json").choose(1, torch.zeros(8000, 4096), NAMES, counting(calls))
    assert calls[-1] == 1  # 131 MB: larger than any cache alone


def test_an_unwritable_table_still_chooses(tmp_path: Path, caplog) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    calls: list[int] = []
    with caplog.at_level(logging.WARNING):
        choice = KernelTable(blocker / "products.json").choose(5, torch.zeros(64, 32), NAMES, counting(calls))  # fmt: skip
    assert choice == "fast"
    assert "could not be written" in caplog.text


def test_the_table_prints_one_row_per_shape_in_order(tmp_path: Path) -> None:
    table = KernelTable(tmp_path / "products.json")
    for rows in (16, 5):
        table.choose(rows, torch.zeros(64, 32), NAMES, counting([]))
    text = kernel_table.markdown(table)
    threads = torch.get_num_threads()
    assert text.index(f"| {threads} threads, 5 rows, 64x32 | fast |") < text.index("16 rows")
    assert "| – | – |" in text  # onednn, few_rows: not candidates here


def test_measuring_leaves_the_global_random_state_alone(tmp_path: Path) -> None:
    """A seeded sampling run measures kernels on its first call only: the draws after it
    must be those of a run that measured nothing."""
    torch.manual_seed(7)
    KernelTable(tmp_path / "products.json").choose(5, torch.zeros(64, 32), NAMES, counting([]))
    after = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(after, torch.rand(3))
