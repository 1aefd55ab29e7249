"""Speculative-decoding counters (upstream V0 definitions).

- draft tokens: tokens proposed (sum of proposal lengths);
- accepted tokens: proposed tokens the rejection sampler kept;
- emitted tokens: tokens returned by speculative steps (accepted + one per sequence);
- acceptance rate = accepted / draft;
- system efficiency = emitted / (spec sequence-steps x (k + 1)), the fraction of the most
  tokens a step could emit.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class SpecDecodeMetrics:
    """Cumulative counters; ``snapshot()`` adds the two ratios (0.0 before any step)."""

    k: int
    num_spec_steps: int = 0  # sequence-steps that went through the scorer
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_emitted_tokens: int = 0

    def record(self, num_seqs: int, draft: int, accepted: int, emitted: int) -> None:
        """Add one step of ``num_seqs`` scored sequences."""
        self.num_spec_steps += num_seqs
        self.num_draft_tokens += draft
        self.num_accepted_tokens += accepted
        self.num_emitted_tokens += emitted

    def snapshot(self) -> dict:
        """The counters plus draft_acceptance_rate and system_efficiency."""
        d = asdict(self)
        d["draft_acceptance_rate"] = (
            self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0
        )
        most = self.num_spec_steps * (self.k + 1)
        d["system_efficiency"] = self.num_emitted_tokens / most if most else 0.0
        return d
