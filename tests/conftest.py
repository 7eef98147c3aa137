"""Tiny NLLB-architecture models shared by the tests.

The target is trained for a few seconds on a synthetic task with real ambiguity (each
source token has two plausible translations, and some are doubled), so beam search
genuinely branches; untrained models make poor oracles (near-uniform, full of ties).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack

import pytest
import torch
from fairseq2.data.tokenizers import VocabularyInfo
from fairseq2.models.transformer import TransformerModel

from specbeam.data.batches import pad
from specbeam.integration.models import ModelArch, build_model
from specbeam.kernels import attention
from specbeam.kernels.runtime import Runtime
from specbeam.search.head import DraftHead, HeadArch

# Tiny models gain nothing from intra-op threads, and lose a lot when the machine is busy.
torch.set_num_threads(1)
# The kernel table the tests measure (their tiny shapes; apps they start inherit it) is
# theirs, not the user's (`specbeam.kernels.kernel_table`).
os.environ.setdefault("SPECBEAM_KERNEL_DIR", tempfile.mkdtemp(prefix="specbeam-kernels-"))

VOCAB = VocabularyInfo(size=48, unk_idx=1, bos_idx=2, eos_idx=3, pad_idx=0)
SRC_TOKENS = range(4, 24)  # source symbols; each maps to two target symbols in 24..47
PROMPT = torch.tensor([3])  # fairseq2's default seq2seq prompt: [EOS]
NLLB_PROMPT = torch.tensor([3, 5])  # a two-token prefix like NLLB's [</s>, __lang__]

TARGET_ARCH = ModelArch(
    model_dim=64, num_encoder_layers=1, num_decoder_layers=2, num_attn_heads=4,
    ffn_inner_dim=128, dropout_p=0.0, vocab_size=VOCAB.size, max_seq_len=128,
)  # fmt: skip
DRAFT_ARCH = ModelArch(
    model_dim=32, num_encoder_layers=1, num_decoder_layers=1, num_attn_heads=2,
    ffn_inner_dim=64, dropout_p=0.0, vocab_size=VOCAB.size, max_seq_len=128,
)  # fmt: skip


def synthetic_pair(gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Source `s1..sn </s>`; target `[EOS] t1..tm </s>` with ambiguous choices per token."""
    n = int(torch.randint(2, 9, (1,), generator=gen))
    src = torch.randint(SRC_TOKENS.start, SRC_TOKENS.stop, (n,), generator=gen)
    out = []
    for s in src.tolist():
        alt = torch.rand(1, generator=gen).item()
        t = 24 + (s - 4) if alt < 0.6 else 24 + (s - 4 + 7) % 20 + 4
        out.append(min(t, 47))
        if torch.rand(1, generator=gen).item() < 0.25:
            out.append(min(t, 47))
    src = torch.cat([src, torch.tensor([3])])
    tgt = torch.tensor([3, *out, 3])
    return src, tgt


def train_tiny(model: TransformerModel, steps: int, seed: int) -> TransformerModel:
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        pairs = [synthetic_pair(gen) for _ in range(32)]
        src, src_layout = pad([p[0] for p in pairs], 0)
        tgt, _ = pad([p[1] for p in pairs], 0)
        tgt_in, tgt_out = tgt[:, :-1], tgt[:, 1:]
        in_layout = type(src_layout).of(tgt_in, [len(p[1]) - 1 for p in pairs])
        loss = model(src, src_layout, tgt_in, in_layout, tgt_out)
        opt.zero_grad()
        (loss / (tgt_out != 0).sum()).backward()
        opt.step()
    return model.eval()


@pytest.fixture(scope="session")
def vocab_info() -> VocabularyInfo:
    return VOCAB


@pytest.fixture(scope="session")
def tiny_target() -> TransformerModel:
    torch.manual_seed(0)
    return train_tiny(build_model(TARGET_ARCH), steps=300, seed=0)


@pytest.fixture(scope="session")
def tiny_draft() -> TransformerModel:
    """A smaller, briefly trained draft: agrees with the target often, not always."""
    torch.manual_seed(1)
    return train_tiny(build_model(DRAFT_ARCH), steps=60, seed=1)


@pytest.fixture(scope="session")
def untrained_draft() -> TransformerModel:
    torch.manual_seed(2)
    return build_model(DRAFT_ARCH).eval()


@pytest.fixture(scope="session")
def copy_draft(tiny_target: TransformerModel) -> TransformerModel:
    return copy.deepcopy(tiny_target).eval()


@pytest.fixture(scope="session")
def untrained_head(tiny_target: TransformerModel) -> DraftHead:
    """A draft head over the tiny target with a random input projection: it agrees
    with the target sometimes, by the layers it copied."""
    torch.manual_seed(3)
    return DraftHead(tiny_target, HeadArch(num_layers=1)).eval()


@pytest.fixture(scope="session")
def random_head(tiny_target: TransformerModel) -> DraftHead:
    """Two layers, every weight of its own random: proposals unrelated to the target."""
    torch.manual_seed(4)
    head = DraftHead(tiny_target, HeadArch(num_layers=2))
    for p in head.own_parameters():
        torch.nn.init.normal_(p, std=0.3)
    return head.eval()


@pytest.fixture(scope="session")
def fused_head(tiny_target: TransformerModel) -> DraftHead:
    """A head over the target's first decoder layer and its final state (EAGLE-3), with
    a random fusion: the lower layer's output really reaches its proposals."""
    torch.manual_seed(7)
    head = DraftHead(tiny_target, HeadArch(num_layers=1, feature_layers=(0,)))
    assert head.fuse is not None
    torch.nn.init.normal_(head.fuse.weight, std=0.2)
    return head.eval()


def train_head_briefly(head: DraftHead, data, rows: int, steps: int, unroll: int) -> DraftHead:  # noqa: ANN001
    """Adam on the head's own weights, batches of 16 of the first `rows` pairs of `data` (a
    `HeadData`), with the real trainer's loss."""
    from specbeam.training.train_head import head_loss

    head.requires_grad_(False)
    for p in head.own_parameters():
        p.requires_grad_(True)
    opt = torch.optim.Adam(head.own_parameters(), lr=3e-3)
    for step in range(steps):
        batch = data.batch([(step * 16 + i) % rows for i in range(16)], 0)
        loss, metrics = head_loss(head, batch, unroll, 0.5)
        opt.zero_grad()
        (loss / metrics[0].positions).backward()
        opt.step()
    return head


@pytest.fixture(scope="session")
def tiny_head(tiny_target: TransformerModel) -> DraftHead:
    """A head trained briefly on the tiny target's states (the real trainer's loss)."""
    from specbeam.data.tokens import TokenizedPair
    from specbeam.training.head_data import compute_head_data

    gen = torch.Generator().manual_seed(6)
    pairs = [TokenizedPair(*synthetic_pair(gen)) for _ in range(256)]
    data = compute_head_data(tiny_target, pairs, 0, 8, prompt_len=1, bf16=False)
    torch.manual_seed(5)
    head = train_head_briefly(DraftHead(tiny_target, HeadArch(num_layers=1)), data, 256, 120, 3)
    return head.requires_grad_(False).eval()


def sources(seed: int, batch: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [synthetic_pair(gen)[0] for _ in range(batch)]


@pytest.fixture
def kernel_attention(monkeypatch) -> None:
    """The lean Python loop attends through the extension's kernel, as the native loop
    does, even with `hardware.native` off (where an fp32 model's attention is torch's SDPA:
    the same numbers within fp32 rounding only)."""
    monkeypatch.setattr(attention, "kernel_runs", lambda q: q.dtype == torch.float32)


@pytest.fixture
def use_runtime() -> Iterator[Callable[..., None]]:
    """`use_runtime(native=False)`: the current runtime with these settings changed, for
    the rest of the test (as a generator's call would make its own current)."""
    with ExitStack() as stack:

        def use(**settings: object) -> None:
            config = dataclasses.replace(Runtime.current().config, **settings)
            stack.enter_context(Runtime(config).active())

        yield use
