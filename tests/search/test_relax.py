"""Relaxed acceptance: which drafted children it keeps, and that scores stay the target's."""

from __future__ import annotations

import pytest
import torch

from specbeam.data.batches import pad
from specbeam.search.generator import SpeculativeBeamSearchSeq2SeqGenerator
from specbeam.search.relax import Relaxation, relaxed_step
from specbeam.search.tree import DraftTree
from tests.conftest import PROMPT, sources

# One source, two live hypotheses over a 5-token vocabulary; level 0 of a 3-wide tree.
LPROBS = torch.tensor([[[0.5, 0.3, 0.1, 0.05, 0.05], [0.6, 0.2, 0.1, 0.05, 0.05]]]).log()
SCORES = torch.tensor([[-1.0, -1.5]])


def tree(tokens: list[int], parents: list[int]) -> DraftTree:
    shape = (1, 1, len(tokens))
    return DraftTree(
        torch.tensor(tokens).view(shape),
        torch.tensor(parents).view(shape),
        torch.ones(shape, dtype=torch.bool),
        torch.zeros(shape),
    )


def test_keeps_the_best_acceptable_children_by_target_score() -> None:
    draft = tree(tokens=[1, 0, 2], parents=[0, 1, 1])
    step = relaxed_step(
        Relaxation(top=3, gap=2.0), LPROBS, SCORES, torch.tensor([[0, 1]]), draft, 0, 2
    )
    assert step.ok.tolist() == [True]
    assert step.parent.tolist() == [[1, 0]] and step.token.tolist() == [[0, 1]]
    want = [-1.5 + LPROBS[0, 1, 0], -1.0 + LPROBS[0, 0, 1]]
    assert torch.allclose(step.score, torch.tensor([want]))
    assert step.child.tolist() == [[1, 0]]


@pytest.mark.parametrize(
    ("relax", "ok"),
    [
        (Relaxation(top=1, gap=5.0), False),  # token 1 of hypothesis 0 is its 2nd best
        (Relaxation(top=2, gap=0.3), False),  # and log(0.5 / 0.3) = 0.51 below its best
        (Relaxation(top=2, gap=0.6), True),
    ],
)
def test_rank_and_gap_limits(relax: Relaxation, ok: bool) -> None:
    draft = tree(tokens=[1, 0, 3], parents=[0, 1, 1])  # token 3 is never acceptable here
    step = relaxed_step(relax, LPROBS, SCORES, torch.tensor([[0, 1]]), draft, 0, 2)
    assert step.ok.tolist() == [ok]


def test_children_of_other_hypotheses_do_not_count() -> None:
    draft = tree(tokens=[0, 1, 0], parents=[0, 0, 7])  # 7: not a current hypothesis
    step = relaxed_step(
        Relaxation(top=5, gap=9.0), LPROBS, SCORES, torch.tensor([[0, 1]]), draft, 0, 3
    )
    assert step.ok.tolist() == [False]


@pytest.mark.parametrize("draft_name", ["tiny_draft", "tiny_head"])
def test_relaxed_search_advances_further_and_keeps_target_scores(
    tiny_target, draft_name, request, vocab_info
) -> None:
    """More steps per pass than exact search on the same pair, and every output's step
    scores are the target's own log-probs of its tokens (teacher-forced)."""
    tiny_draft = request.getfixturevalue(draft_name)
    srcs = sources(seed=7, batch=8)
    src, src_layout = pad(srcs, 0)
    prompts, prompt_layout = pad([PROMPT] * 8, 0)
    runs = {}
    for relax in (None, Relaxation(top=3, gap=2.0)):
        top, gap = (0, 2.0) if relax is None else (relax.top, relax.gap)
        gen = SpeculativeBeamSearchSeq2SeqGenerator(
            tiny_target, tiny_draft, vocab_info, beam_size=4, max_gen_len=(2.0, 5),
            relax_top=top, relax_gap=gap,
        )  # fmt: skip
        runs[relax] = gen(src, src_layout, prompts, prompt_layout)
    exact, relaxed = runs.values()
    assert relaxed.stats.tau > exact.stats.tau + 0.2, (exact.stats.tau, relaxed.stats.tau)
    for source, hyps in zip(srcs, relaxed.hypotheses, strict=True):
        for hyp in hyps:
            full = torch.cat([PROMPT, hyp.seq])[None]
            src_i, src_i_layout = pad([source], 0)
            tgt_in, tgt_layout = pad([full[0, :-1]], 0)
            logits = tiny_target(src_i, src_i_layout, tgt_in, tgt_layout)
            lprobs = torch.log_softmax(logits.float(), -1)[0]
            want = lprobs.gather(1, full[0, 1:, None]).squeeze(1)[len(PROMPT) - 1 :]
            assert torch.allclose(hyp.step_scores, want, atol=1e-5)
