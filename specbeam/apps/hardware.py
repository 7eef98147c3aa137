"""Hardware settings: device, threads, kernels, precision of drafting, batch size, and the
decoding settings that `python -m specbeam.calibrate` found fastest on this machine."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from omegaconf import OmegaConf

from specbeam.apps.paths import REPO_ROOT
from specbeam.search import native, onednn
from specbeam.search.memory import MB
from specbeam.search.planner import LinearCost, PassShape, PlanCosts, Planner

if TYPE_CHECKING:
    from specbeam.apps.decoding import DecodingConfig


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(kw_only=True)
class HardwareConfig:
    name: str = "cpu"
    device: str = "cpu"
    threads: int = 2
    draft_dtype: str = "float32"
    """Precision of the draft model; exactness does not depend on it (verification is fp32).
    auto: bfloat16 where the CPU computes it natively (`onednn.bf16_native`), else float32."""
    target_dtype: str = "float32"
    """Precision of the target. Exact speculative decoding reproduces beam search on the
    target in this precision; bfloat16 is faster where that matters less (distillation
    data), but its rounding makes near-ties flip more often than fp32's."""
    onednn: bool = True
    """Linear layers of the lean decoders through oneDNN with packed weights
    (`specbeam.search.onednn`): about 2× faster decoder calls on AVX-512 CPUs where
    MKL's sgemm is slow; false: PyTorch's default."""
    onednn_min_rows: int | None = None
    """fp32 products of fewer rows run on PyTorch's default (MKL) instead. Unset: 8 on
    Intel CPUs, whose MKL small-GEMM kernels win below that, 1 elsewhere
    (`onednn.default_min_rows`)."""
    native: bool = True
    """The lean decoders' layer loop compiled (`specbeam.search.native`, built once by
    scripts/setup.sh): the same ops without the interpreter, same numbers; false: in
    Python."""
    batch_tokens: int = 1024
    """Padded source tokens per batch (sentences are grouped by length)."""
    memory_budget_mb: float = 0
    """Speculative decoding keeps its KV caches and logits within this many MiB by
    decoding a batch in chunks (same output), or a smaller draft; 0 = unlimited."""
    costs: dict[str, Any] = field(default_factory=dict)
    """This machine's cost model for the planner (`specbeam.search.planner`), written by
    specbeam.calibrate: `target` and `draft` ([a, b]: a + b·T ms per call over T query
    tokens), `accept_ms` (per pass and source) and `plain_step_ms` (the plain search's
    work per step beside its target call). Empty: no planning, spec_beam always speculates."""
    tuned: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Decoding name -> settings (gamma, draft_width, ...) that replace the decoding file's on
    this machine; written by specbeam.apps.calibrate. Command-line values such as
    decoding.gamma=… still win."""

    def apply(self) -> None:
        if self.device != "cpu":
            raise ValueError(f"hardware.device={self.device} is not supported yet: allowed: cpu")
        if self.threads < 1:
            raise ValueError(f"hardware.threads={self.threads} is invalid: must be ≥ 1")
        for name, allowed in (("draft_dtype", [*_DTYPES, "auto"]), ("target_dtype", _DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"hardware.{name}={getattr(self, name)} is invalid: allowed: {', '.join(allowed)}"
                )
        if self.batch_tokens < 1:
            raise ValueError(f"hardware.batch_tokens={self.batch_tokens} is invalid: must be ≥ 1")
        if self.memory_budget_mb < 0:
            raise ValueError(
                f"hardware.memory_budget_mb={self.memory_budget_mb} is invalid: must be ≥ 0 "
                "(0 = unlimited)"
            )
        if self.onednn_min_rows is not None and self.onednn_min_rows < 1:
            raise ValueError(
                f"hardware.onednn_min_rows={self.onednn_min_rows} is invalid: must be ≥ 1"
            )
        torch.set_num_threads(self.threads)
        onednn.enable(self.onednn)
        onednn.set_min_rows(self.onednn_min_rows or onednn.default_min_rows())
        native.enable(self.native)

    @property
    def draft_torch_dtype(self) -> torch.dtype:
        if self.draft_dtype == "auto":
            return torch.bfloat16 if onednn.bf16_native() else torch.float32
        return _DTYPES[self.draft_dtype]

    @property
    def target_torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.target_dtype]

    @property
    def memory_budget_bytes(self) -> int | None:
        return int(self.memory_budget_mb * MB) or None

    def planner(self, decoding: DecodingConfig) -> Planner | None:
        """A fresh planner for `decoding` on this machine's cost model (None without one,
        or where the decoding may not switch to plain search)."""
        if not (self.costs and decoding.plan and decoding.exact_beam):
            return None
        c = self.costs
        try:
            costs = PlanCosts(
                LinearCost(*c["target"]), LinearCost(*c["draft"]), float(c["accept_ms"]),
                float(c["plain_step_ms"]),
            )  # fmt: skip
        except (KeyError, TypeError) as error:
            raise ValueError(f"hardware.costs is incomplete or malformed: {error}") from None
        shape = PassShape.expected(decoding.draft_shape(), decoding.plan_tau)
        return Planner(costs, decoding.beam_size, shape)

    def tune(self, decoding: DecodingConfig, keep: Collection[str] = ()) -> DecodingConfig:
        """`decoding` with this machine's calibrated settings for its name, if any, but
        for the settings in `keep` (those the user gave explicitly) and those a method
        string names (`spec_beam:draft_width=20` keeps width 20, takes the tuned γ)."""
        name, named = decoding.method_settings()
        keep = {*keep, *named}
        settings = self.tuned.get(name, {})
        unknown = set(settings) - {f.name for f in dataclasses.fields(decoding)}
        if unknown:
            raise ValueError(
                f"hardware.tuned.{name} has unknown settings: {', '.join(sorted(unknown))}"
            )
        return dataclasses.replace(decoding, **{k: v for k, v in settings.items() if k not in keep})


def load_hardware(name: str) -> HardwareConfig:
    """`conf/hardware/<name>.yaml` outside a Hydra app (the fairseq2 extension)."""
    path = REPO_ROOT / "conf" / "hardware" / f"{name}.yaml"
    if not path.exists():
        known = ", ".join(sorted(p.stem for p in path.parent.glob("*.yaml")))
        raise ValueError(f"hardware={name}: no {path}; allowed: {known}")
    merged = OmegaConf.merge(OmegaConf.structured(HardwareConfig), OmegaConf.load(path))
    return OmegaConf.to_object(merged)
