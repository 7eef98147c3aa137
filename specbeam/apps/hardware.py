"""Hardware settings: how this machine runs a search, the process's device, threads and
precisions, and the decoding settings `python -m specbeam.calibrate` found fastest here."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf

from specbeam.apps.decoding import reaching
from specbeam.integration.models import Draft, LoadedPair, cast_draft
from specbeam.kernels import cpu, onednn, quant
from specbeam.paths import config_file
from specbeam.search.config import MachineSettings
from specbeam.search.head import DraftHead
from specbeam.search.planner import PlanCosts

if TYPE_CHECKING:
    from specbeam.apps.decoding import DecodingConfig


log = logging.getLogger("specbeam.hardware")

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_TARGET_DTYPES = ("float32", *quant.PRECISIONS, "auto")


@dataclass(kw_only=True)
class HardwareConfig(MachineSettings):
    """A hardware file (`conf/hardware/`): how this machine runs a search
    (`MachineSettings`: kernels, memory budget, the planner's costs), and the process's
    device, threads, precisions and batching."""

    name: str = "cpu"
    """The hardware config's name, that of its file (conf/hardware/<name>.yaml or the
    user's); calibrate keeps a user config's other `tuned` entries."""
    device: str = "cpu"
    """cpu, or cuda where torch sees a GPU (not yet measured by this project)."""
    threads: int = 2
    """CPU threads torch runs on (`torch.set_num_threads`); ≥ 1."""
    draft_dtype: str = "float32"
    """Precision of the draft model; exactness does not depend on it (verification runs
    the target's): float32, bfloat16, int8 (a draft head's products as the target's in
    `target_dtype=int8`) or auto. auto: a draft head in the precision `auto_precision` picks
    here; a draft model in bfloat16 where the CPU computes it natively, else float32."""
    target_dtype: str = "float32"
    """Precision of the target's linear layers (`specbeam.kernels.quant`; norms, attention
    and softmax stay fp32): float32, bfloat16 (bf16 products, fp32 sums), int8 (per-row
    and per-channel scales) or auto. Exact speculative search reproduces plain beam search on the
    target in this precision. auto: the precision `auto_precision` picks here."""
    batch_tokens: int = 1024
    """Padded source tokens per batch (sentences are grouped by length)."""
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Decoding name -> settings (gamma, draft_width, ...) that replace the decoding file's on
    this machine; written by specbeam.calibrate. Command-line values such as
    decoding.gamma=… still win."""

    def validate(self) -> None:
        """Raises a ValueError naming the first setting out of range, as a hardware file
        does; checked when made (`MachineSettings`), so as a file is read."""
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"hardware.device={self.device} is invalid: allowed: cpu, cuda")
        if self.threads < 1:
            raise ValueError(f"hardware.threads={self.threads} is invalid: must be ≥ 1")
        for name, allowed in (
            ("draft_dtype", [*_DTYPES, "int8", "auto"]),
            ("target_dtype", _TARGET_DTYPES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"hardware.{name}={getattr(self, name)} is invalid: allowed: {', '.join(allowed)}"
                )
        if self.batch_tokens < 1:
            raise ValueError(f"hardware.batch_tokens={self.batch_tokens} is invalid: must be ≥ 1")
        for name, value, allowed in self.problems():
            raise ValueError(f"hardware.{name}={value} is invalid: must be {allowed}")

    def apply(self) -> None:
        """Sets the process's threads, where this machine runs what the settings ask: a
        GPU, and planner costs the planner can read (before the models load)."""
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("hardware.device=cuda is invalid: torch sees no GPU here")
        if self.costs:
            PlanCosts.from_stored(self.costs)
        torch.set_num_threads(self.threads)

    @property
    def draft_torch_dtype(self) -> torch.dtype:
        """The dtype the draft is loaded in (int8 and auto: float32, then `place`)."""
        return _DTYPES.get(self.draft_dtype, torch.float32)

    @functools.cached_property
    def target_precision(self) -> str:
        """float32, bfloat16 or int8: `target_dtype` with auto resolved, and float32 for a
        precision this CPU only emulates (slower than fp32: `onednn.native`); found once."""
        precision = auto_precision() if self.target_dtype == "auto" else self.target_dtype
        return precision if onednn.native(precision) else "float32"

    def place(self, pair: LoadedPair) -> LoadedPair:
        """The pair on this machine's device, the target's products in their precision
        (the draft's was chosen at loading)."""
        pair.target.to(device=self.device)
        precision = self.target_precision
        if self.target_dtype == "auto":
            log.info("hardware.target_dtype=auto: the target runs %s, as %s", *auto_choice())
        if precision != self.target_dtype and self.target_dtype != "auto":
            needs = (
                "native bf16"
                if self.target_dtype == "bfloat16"
                else "VNNI or AMX for int8 products, nor AVX2 with the native extension built"
            )
            log.warning(
                "hardware.target_dtype=%s: this CPU has no %s (its flags: %s), "
                "so the target runs float32",
                self.target_dtype,
                needs,
                " ".join(cpu.cpu_flags()) or "no AVX2",
            )
        if precision != "float32":
            if self.device != "cpu":
                raise ValueError(f"hardware.target_dtype={self.target_dtype} runs on the CPU only")
            try:
                # A draft head holds the target's final projection: it reads the new one.
                quant.quantize(pair.target, precision, [] if pair.draft is None else [pair.draft])
            except ValueError as error:
                raise ValueError(
                    f"hardware.target_dtype={self.target_dtype} cannot run this target: {error}"
                ) from None
        if pair.draft is not None:
            pair.draft.to(device=self.device)
            if self.draft_dtype == "int8":
                self._quantize_draft(pair.draft)
            elif self.draft_dtype == "auto":
                self._place_auto_draft(pair)
        return pair

    def _place_auto_draft(self, pair: LoadedPair) -> None:
        """`draft_dtype=auto` on the float32 draft it loaded."""
        assert pair.draft is not None
        head = isinstance(pair.draft, DraftHead)
        precision = auto_precision() if head and self.device == "cpu" else "float32"
        if precision == "int8":
            pair.draft.quantize("int8")
        elif precision == "bfloat16" or (not head and onednn.bf16_native()):
            pair.draft = cast_draft(pair.draft, pair.target, torch.bfloat16)

    def _quantize_draft(self, draft: Draft) -> None:
        if not isinstance(draft, DraftHead):
            raise ValueError("hardware.draft_dtype=int8 runs a draft head, not a draft model")
        if self.device != "cpu" or not onednn.native("int8"):
            log.warning(
                "hardware.draft_dtype=int8: this CPU runs no int8 products fast (its flags: "
                "%s), so the draft runs float32",
                " ".join(cpu.cpu_flags()) or "no AVX2",
            )
            return
        draft.quantize("int8")

    def tune(self, decoding: DecodingConfig, keep: Collection[str] = ()) -> DecodingConfig:
        """`decoding` with this machine's calibrated settings for its name, if any, but
        for the settings in `keep` (those the user gave explicitly) and those a method
        string names (`spec_beam:draft_width=20` keeps width 20, takes the tuned γ).
        Tuned `gamma_bounds` widen to include a γ kept this way; bounds the user gave do not."""
        name, named = decoding.method_settings()
        keep = {*keep, *named}
        settings = self.tuned.get(name, {})
        unknown = set(settings) - {f.name for f in dataclasses.fields(decoding)}
        if unknown:
            raise ValueError(
                f"hardware.tuned.{name} has unknown settings: {', '.join(sorted(unknown))}"
            )
        taken = {k: v for k, v in settings.items() if k not in keep}
        tuned = dataclasses.replace(decoding, **taken)
        if "gamma_bounds" in taken:  # tuned bounds make room for the user's γ
            tuned.gamma_bounds = reaching(tuned.gamma_bounds, tuned.gamma)
        return tuned


def load_hardware(name: str) -> HardwareConfig:
    """`conf/hardware/<name>.yaml` outside a Hydra app."""
    merged = OmegaConf.merge(
        OmegaConf.structured(HardwareConfig), OmegaConf.load(config_file("hardware", name))
    )
    return OmegaConf.to_object(merged)


def auto_precision() -> str:
    """`target_dtype=auto`, and a draft head's `draft_dtype=auto`: int8 where its sums run
    on fbgemm (`quant.fbgemm_sums`), else bfloat16 where the CPU computes bf16 natively,
    else int8 where int8 products run fast (`onednn.int8_native`), else float32
    (docs/bench.md, "Figures behind design choices", has the measurements behind this
    rule)."""
    return auto_choice()[0]


def auto_choice() -> tuple[str, str]:
    """`auto_precision` and why, as a notice says it: auto names no precision itself."""
    if quant.fbgemm_sums() is not None:
        return "int8", "this CPU sums int8 products on fbgemm (AVX2, the native extension built)"
    if onednn.bf16_native():
        return "bfloat16", "this CPU computes bf16 natively"
    if onednn.int8_native():
        return "int8", "this CPU has int8 dot products (VNNI or AMX)"
    return "float32", "this CPU has neither native bf16 nor fast int8 products"
