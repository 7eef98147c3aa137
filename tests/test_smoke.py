"""The fixtures build real fairseq2 models, and fairseq2's own beam search runs on them."""

from fairseq2.generation.beam_search import BeamSearchSeq2SeqGenerator

from specbeam.data.batches import pad
from specbeam.integration.models import num_parameters
from tests.conftest import PROMPT, sources


def test_draft_is_smaller_than_target(tiny_target, tiny_draft) -> None:
    assert num_parameters(tiny_draft) * 4 < num_parameters(tiny_target)
    assert tiny_draft.final_proj.weight.size(0) == tiny_target.final_proj.weight.size(0)


def test_fairseq2_beam_search_runs_on_tiny_target(tiny_target, vocab_info) -> None:
    src, src_layout = pad(sources(seed=3, batch=4), 0)
    prompts, prompt_layout = pad([PROMPT] * 4, 0)
    gen = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=3, max_gen_len=(2, 5))
    out = gen(src, src_layout, prompts, prompt_layout)
    assert len(out.hypotheses) == 4
    for hyps in out.hypotheses:
        assert len(hyps) == 3
        assert all(int(h.seq[-1]) == vocab_info.eos_idx for h in hyps)
        scores = [float(h.score) for h in hyps]
        assert scores == sorted(scores, reverse=True)


def test_trained_tiny_target_branches(tiny_target, vocab_info) -> None:
    """The oracle must be non-trivial: beam search keeps distinct hypotheses."""
    src, src_layout = pad(sources(seed=4, batch=8), 0)
    prompts, prompt_layout = pad([PROMPT] * 8, 0)
    gen = BeamSearchSeq2SeqGenerator(tiny_target, vocab_info, beam_size=4, max_gen_len=(2, 5))
    out = gen(src, src_layout, prompts, prompt_layout)
    distinct = [len({tuple(h.seq.tolist()) for h in hyps}) for hyps in out.hypotheses]
    assert min(distinct) == 4
    lengths = {len(h.seq) for hyps in out.hypotheses for h in hyps}
    assert len(lengths) > 3
