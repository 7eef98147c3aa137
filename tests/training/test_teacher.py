"""The stored top-k of a teacher: exact against its full distributions, and never stale."""

from __future__ import annotations

import torch

from specbeam.data.batches import pad
from specbeam.data.tokens import TokenizedPair
from specbeam.integration.models import save_model
from specbeam.training.teacher import compute_teacher_topk, load_or_compute
from tests.conftest import TARGET_ARCH, synthetic_pair


def pairs(n: int, seed: int = 3) -> list[TokenizedPair]:
    gen = torch.Generator().manual_seed(seed)
    return [TokenizedPair(*synthetic_pair(gen)) for _ in range(n)]


def test_top_k_rows_are_the_teachers_own_distribution(tiny_target) -> None:
    data = pairs(9)
    topk = compute_teacher_topk(tiny_target, data, 0, k=5, max_tokens=30, bf16=False)
    for i in (0, 4, 8):
        p = data[i]
        s, s_layout = pad([p.source], 0)
        t, t_layout = pad([p.target[:-1]], 0)
        with torch.inference_mode():
            full = tiny_target(s, s_layout, t, t_layout)[0].log_softmax(-1)  # (T, V)
        want = full.topk(5, -1)
        idx, logp = topk.batch([i], len(p.target) + 2)
        n = len(p.target) - 1
        assert torch.equal(idx[0, :n], want.indices)
        torch.testing.assert_close(logp[0, :n], want.values, atol=2e-3, rtol=1e-3)  # fp16 storage
        assert not idx[0, n:].any()  # padding


def test_a_stored_top_k_is_reused_only_for_the_same_data_and_teacher(tmp_path, tiny_target) -> None:
    save_model(tiny_target, TARGET_ARCH, tmp_path / "t.pt", torch.float32)
    data = pairs(6)
    first = load_or_compute(tmp_path / "top.pt", tmp_path / "t.pt", data, 0, 4, bf16=False)
    stamp = (tmp_path / "top.pt").stat().st_mtime_ns
    again = load_or_compute(tmp_path / "top.pt", tmp_path / "t.pt", data, 0, 4, bf16=False)
    assert (tmp_path / "top.pt").stat().st_mtime_ns == stamp
    assert torch.equal(first.indices, again.indices)
    other = pairs(6, seed=4)
    fresh = load_or_compute(tmp_path / "top.pt", tmp_path / "t.pt", other, 0, 4, bf16=False)
    assert (tmp_path / "top.pt").stat().st_mtime_ns != stamp
    assert len(fresh.offsets) == 7 and int(fresh.offsets[-1]) == sum(
        len(p.target) - 1 for p in other
    )
