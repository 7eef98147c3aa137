"""Exact acceptance on a hand-made verification: when a pass may go on past a hypothesis
the draft missed."""

from __future__ import annotations

import math

import pytest
import torch

from specbeam.search.accept import BeamAcceptor
from specbeam.search.beam import BeamState, HypothesisFactory
from specbeam.search.rules import ScoringRules
from specbeam.search.tree import DraftTree
from specbeam.search.tree_attention import SlotTable
from specbeam.search.verify import Verification

PAD, EOS, VOCAB, K = 0, 1, 8, 2


def _logits(probs: dict[int, float]) -> torch.Tensor:
    """Log-probs with the given tokens' probabilities, the rest spread evenly."""
    rest = (1.0 - sum(probs.values())) / (VOCAB - len(probs))
    return torch.tensor([math.log(probs.get(t, rest)) for t in range(VOCAB)])


def _accept(second_score: float) -> tuple:
    """Beam 2 at step 3 with hypotheses scored 0 and `second_score`; the draft tree has
    one level, both nodes below hypothesis 0 (tokens 3 and 5). Step 0 keeps 0·3 (a node)
    and 1·4 (off the tree); step 1 ranks 0·3·6, then EOS, then 0·3·7."""
    rules = ScoringRules(EOS, PAD, None, 0.0, 1.0, min_seq_len=1, max_seq_len=20)
    finish = HypothesisFactory(EOS, 1, echo_prompt=False, normalize_scores=True, len_penalty=1.0)
    state = BeamState.start(torch.tensor([[EOS, 2, 2]]), K, 20)
    state.scores, state.n = torch.tensor([[0.0, second_score]]), K
    logits = torch.stack(
        [
            _logits({3: 0.9}),  # after hypothesis 0
            _logits({4: 0.6}),  # after hypothesis 1
            _logits({6: 0.55, EOS: 0.3, 7: 0.1}),  # after node 0·3
            _logits({}),  # after node 0·5
        ]
    )[None]
    verification = Verification(
        SlotTable(1, 4, torch.device("cpu")),
        chain_slots=torch.tensor([[[0], [1]]]),
        node_slots=torch.tensor([[[2, 3]]]),
        hidden=torch.zeros((1, 4, 1)),
        logits=logits,
    )
    tree = DraftTree(
        tokens=torch.tensor([[[3, 5]]]),
        parents=torch.zeros((1, 1, 2), dtype=torch.int64),
        valid=torch.ones((1, 1, 2), dtype=torch.bool),
        scores=torch.zeros((1, 1, 2)),
    )
    output: list[list] = [[]]
    acceptance = BeamAcceptor(rules, K, finish).accept(state, verification, tree, output)
    return acceptance, state, output


def test_an_off_tree_hypothesis_below_the_kth_non_eos_candidate_does_not_stop_the_pass() -> None:
    """Hypothesis 1·4 scores ln 0.6 - 2.0 = -2.51: below 0·3·7 (ln 0.9 + ln 0.1 = -2.41),
    the 2nd non-EOS candidate, so none of its children can enter step 1's beam, though
    they could outrank its 4th candidate (the 2k-th, -4.7)."""
    acceptance, state, output = _accept(-2.0)
    assert acceptance.steps.tolist() == [2]
    assert state.seqs[0, :, 3:5].tolist() == [[3, 6], [3, 7]]
    expected = [math.log(0.9) + math.log(0.55), math.log(0.9) + math.log(0.1)]
    assert state.scores[0].tolist() == pytest.approx(expected, abs=1e-5)
    (finished,) = output[0]  # the EOS ranked 2nd, within the top k
    assert finished.seq.tolist() == [2, 2, 3, EOS]
    assert float(finished.score) == pytest.approx((math.log(0.9) + math.log(0.3)) / 4, abs=1e-5)


def test_an_off_tree_hypothesis_that_could_reach_the_beam_stops_the_pass() -> None:
    """At -1.51, a child of 1·4 could rank before 0·3·7: the pass ends after step 0."""
    acceptance, state, output = _accept(-1.0)
    assert acceptance.steps.tolist() == [1]
    assert state.seqs[0, :, 3].tolist() == [3, 4]
    assert output == [[]]
