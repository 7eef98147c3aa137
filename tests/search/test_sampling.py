"""Speculative sampling draws from the target's own sampling distribution.

Statistical tests, all with fixed seeds: chi-square goodness of fit of the drawn tokens
at the first two positions against the target's exact distribution (computed by
teacher forcing), at significance 0.001 each. N = 6,000 draws per test: a rule that
resamples from p instead of the residual after a rejection fails these by a wide margin
(checked below), so the tests have the power to catch a wrong rule.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from fairseq2.generation.sampling import SamplingSeq2SeqGenerator, TopKSampler, TopPSampler

from specbeam.data.batches import pad
from specbeam.search import sampling
from specbeam.search.sampling import SpeculativeSamplingSeq2SeqGenerator, sampler_filter
from tests.conftest import PROMPT, sources

DRAWS = 6000
ALPHA = 1e-3


def chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of counts against probs; cells expected < 5 are pooled into one."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = torch.cat([counts[~small], counts[small].sum().view(1)])
    exp = torch.cat([expected[~small], expected[small].sum().view(1)])
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    assert obs[exp == 0].sum() == 0, "a draw the target gives probability 0"
    stat = float(((obs - exp) ** 2 / exp).sum())
    dof = len(exp) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))


@torch.inference_mode()
def target_marginals(target, source, sampler, temperature: float, vocab_info):
    """Exact distributions of the first generated token and of the second (cell V: no
    second token, the first was EOS), with min/max length rules not binding."""
    keep = sampler_filter(sampler)
    eos, vocab = vocab_info.eos_idx, int(vocab_info.size)

    def dist(prefixes: torch.Tensor) -> torch.Tensor:
        src, src_layout = pad([source] * len(prefixes), 0)
        tgt, tgt_layout = pad(list(prefixes), 0)
        logits = target(src, src_layout, tgt, tgt_layout)[:, -1].float()
        probs = torch.softmax(logits / temperature, -1)
        probs[:, vocab_info.pad_idx] = 0.0
        return keep(probs)

    first = dist(PROMPT[None])[0]
    cont = dist(torch.cat([PROMPT.expand(vocab, -1), torch.arange(vocab)[:, None]], 1))
    second = (first[:, None] * cont).sum(0)
    second -= first[eos] * cont[eos]
    return first, torch.cat([second, first[eos].view(1)])


def draw(target, draft, sampler, temperature, vocab_info, seed: int):
    source = sources(seed=55, batch=1)[0]
    src, src_layout = pad([source], 0)
    prompts, prompt_layout = pad([PROMPT], 0)
    gen = SpeculativeSamplingSeq2SeqGenerator(
        target, draft, vocab_info, sampler, num_gens=DRAWS, temperature=temperature,
        max_gen_len=(0.0, 4), gamma=3, generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip
    out = gen(src, src_layout, prompts, prompt_layout)
    seqs = [h.seq for h in out.hypotheses[0]]
    assert len(seqs) == DRAWS
    vocab = int(vocab_info.size)
    first = torch.bincount(torch.stack([s[0] for s in seqs]), minlength=vocab).float()
    second = torch.bincount(
        torch.tensor([int(s[1]) if len(s) > 1 else vocab for s in seqs]), minlength=vocab + 1
    ).float()
    return source, first, second, out.stats


@pytest.mark.parametrize(
    ("sampler", "temperature"), [(TopKSampler(48), 1.0), (TopPSampler(0.9), 0.8)]
)
@pytest.mark.parametrize("draft_name", ["tiny_draft", "untrained_draft", "untrained_head"])
def test_tokens_follow_the_target_distribution(
    sampler, temperature, draft_name, tiny_target, request, vocab_info
) -> None:
    draft = request.getfixturevalue(draft_name)
    source, first, second, stats = draw(tiny_target, draft, sampler, temperature, vocab_info, 1)
    want_first, want_second = target_marginals(
        tiny_target, source, sampler, temperature, vocab_info
    )
    assert chi_square_p(first, want_first) > ALPHA
    assert chi_square_p(second, want_second) > ALPHA
    assert stats.drafted_tokens > 0 and stats.target_passes > 0


def test_a_wrong_residual_rule_is_caught(tiny_target, untrained_draft, vocab_info, monkeypatch):
    """Resampling from p after a rejection over-weights the draft's tokens: the same
    test must reject it, or it could not catch a broken rule."""
    monkeypatch.setattr(sampling, "residual", lambda p, q: p)
    sampler = TopKSampler(48)
    source, first, second, _ = draw(tiny_target, untrained_draft, sampler, 1.0, vocab_info, 1)
    want_first, want_second = target_marginals(tiny_target, source, sampler, 1.0, vocab_info)
    assert min(chi_square_p(first, want_first), chi_square_p(second, want_second)) < 1e-6


def test_a_good_draft_keeps_several_tokens_per_pass(tiny_target, copy_draft, vocab_info) -> None:
    _, _, _, stats = draw(tiny_target, copy_draft, TopKSampler(48), 1.0, vocab_info, 2)
    assert stats.acceptance_rate > 0.95
    assert stats.tau > 2.5  # up to 4 positions (3 drafted + 1), the last forced EOS


@pytest.mark.parametrize("sampler", [TopKSampler(5), TopPSampler(0.7)])
def test_filters_match_fairseq2_samplers(sampler) -> None:
    """The probabilities behind a fairseq2 sampler's draws (which it does not expose)."""
    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(1, 12) * 2, -1)
    want = sampler_filter(sampler)(probs)[0]
    draws = sampler.sample(probs.expand(20000, -1).clone())
    assert chi_square_p(torch.bincount(draws, minlength=12).float(), want) > ALPHA


def test_same_distribution_as_fairseq2_with_length_rules(tiny_target, tiny_draft, vocab_info):
    """min_gen_len blocks EOS at first: fairseq2's draws and ours agree (two samples).
    The source is repeated rather than drawn with num_gens: fairseq2 0.8.1's sampling
    generator fails on num_gens > 1 (its encoder output is not repeated)."""
    source = sources(seed=56, batch=1)[0]
    src, src_layout = pad([source] * DRAWS, 0)
    prompts, prompt_layout = pad([PROMPT] * DRAWS, 0)
    common = dict(temperature=1.0, max_gen_len=(0.0, 3), min_gen_len=2)
    torch.manual_seed(3)
    plain = SamplingSeq2SeqGenerator(tiny_target, vocab_info, TopKSampler(48), **common)
    ours = SpeculativeSamplingSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, TopKSampler(48), **common
    )
    counts = []
    for gen in (plain, ours):
        hyps = [h for hs in gen(src, src_layout, prompts, prompt_layout).hypotheses for h in hs]
        firsts = torch.stack([h.seq[0] for h in hyps])
        assert vocab_info.eos_idx not in firsts.tolist()
        assert all(len(h.seq) <= 3 for h in hyps)
        counts.append(torch.bincount(firsts, minlength=48).float())
    pooled = (counts[0] + counts[1]) / (2 * DRAWS)
    assert chi_square_p(counts[1], pooled) > ALPHA


@torch.inference_mode()
def test_scores_follow_fairseq2(tiny_target, tiny_draft, vocab_info) -> None:
    """compute_scores: step scores are the target's probabilities of the drawn tokens."""
    source = sources(seed=57, batch=1)[0]
    src, src_layout = pad([source], 0)
    prompts, prompt_layout = pad([PROMPT], 0)
    gen = SpeculativeSamplingSeq2SeqGenerator(
        tiny_target, tiny_draft, vocab_info, TopKSampler(48), num_gens=4, temperature=1.0,
        compute_scores=True, max_gen_len=(0.0, 6),
    )  # fmt: skip
    for hyp in gen(src, src_layout, prompts, prompt_layout).hypotheses[0]:
        full = torch.cat([PROMPT, hyp.seq])
        tgt, tgt_layout = pad([full[:-1]], 0)
        logits = tiny_target(src, src_layout, tgt, tgt_layout)[0].float()
        probs = torch.softmax(logits, -1).gather(1, full[1:, None])[:, 0]
        assert torch.allclose(hyp.step_scores, probs, atol=1e-5)
        assert torch.isclose(hyp.score, probs.log().sum() / len(probs), atol=1e-5)


def test_keyword_defaults_are_fairseq2_samplings(tiny_target, tiny_draft, vocab_info) -> None:
    """A drop-in for SamplingSeq2SeqGenerator: its temperature default, not beam search's."""
    fairseq2 = inspect.signature(SamplingSeq2SeqGenerator).parameters["temperature"].default
    ours = SpeculativeSamplingSeq2SeqGenerator(tiny_target, tiny_draft, vocab_info, TopKSampler(4))
    assert ours.config.search.temperature == fairseq2
