"""The pipeline simulator's stand-in model (``load_format="sim"``).

Each stage's forward waits a configured device time instead of computing, then returns
tensors of the real shapes (zeros): ``IntermediateTensors`` of ``hidden_states`` and
``residual`` [num_tokens, hidden] on a non-last stage, hidden states [num_tokens, hidden]
on the last stage, and float32 logits [rows, vocab] (all zeros, so greedy sampling picks
token 0). Everything around it is the real engine: scheduler, executors, stage workers,
the transfers between stages and the sampler. benchmarks/benchmark_pipeline_sim.py drives
it; it is never a model for outputs.

The device time of one stage's forward, in seconds, is::

    (step_ms + per_row_us * rows / 1000 + per_token_us * tokens / 1000) / 1000 / pp_size

``step_ms`` (default 8.0) is the whole model's fixed time per step, split evenly over the
stages (the weight-bound regime of decode); ``rows`` are the batch's sequences (padded
lanes included) and ``tokens`` its new tokens. The values come from
``ModelConfig.model_loader_extra_config`` (keys ``step_ms``, ``per_row_us``,
``per_token_us``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from torch import nn

from vllm.distributed.utils import get_pp_indices
from vllm.sequence import IntermediateTensors

SIM_KEYS = ("step_ms", "per_row_us", "per_token_us")


@dataclass(frozen=True)
class SimTiming:
    """The stand-in's device-time model (whole model, before the split over stages).

    Attributes:
        step_ms: fixed milliseconds per step.
        per_row_us: extra microseconds per batch row.
        per_token_us: extra microseconds per new token.
    """

    step_ms: float = 8.0
    per_row_us: float = 0.0
    per_token_us: float = 0.0

    @classmethod
    def from_extra_config(cls, extra: dict | None) -> SimTiming:
        """Read ``extra`` (``model_loader_extra_config``).

        Raises:
            ValueError: an unknown key (naming the known ones) or a negative value.
        """
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(SIM_KEYS))
        if unknown:
            raise ValueError(
                f"model_loader_extra_config keys {unknown} are not known to load_format='sim' "
                f"(known: {list(SIM_KEYS)})."
            )
        values = {k: float(v) for k, v in extra.items()}
        bad = {k: v for k, v in values.items() if v < 0}
        if bad:
            raise ValueError(f"simulated device times must be >= 0, got {bad}.")
        return cls(**values)

    def stage_seconds(self, rows: int, tokens: int, pp_size: int) -> float:
        """Device seconds of one stage's forward over ``rows`` rows and ``tokens`` tokens."""
        us = self.step_ms * 1000 + self.per_row_us * rows + self.per_token_us * tokens
        return us / 1e6 / pp_size


class SimStageModel(nn.Module):
    """Stage ``pp_rank`` of ``pp_size`` of a model that only waits (see the module doc).

    Args:
        hf_config: the model's config (hidden_size, vocab_size, num_hidden_layers).
        pp_rank, pp_size: this stage and the number of stages.
        timing: the device-time model.
        dtype: dtype of the hidden states it returns.

    Attributes:
        busy_s: seconds spent waiting in forward passes so far (the simulated device time).
        num_forwards: forward passes so far.
    """

    def __init__(self, hf_config, pp_rank: int, pp_size: int, timing: SimTiming, dtype):
        super().__init__()
        self.hidden_size = hf_config.hidden_size
        self.vocab_size = hf_config.vocab_size
        self.pp_rank, self.pp_size = pp_rank, pp_size
        self.start_layer, self.end_layer = get_pp_indices(
            hf_config.num_hidden_layers, pp_rank, pp_size
        )
        self.timing = timing
        self.dtype = dtype
        self.busy_s = 0.0
        self.num_forwards = 0
        self.anchor = nn.Parameter(torch.zeros(1, dtype=dtype), requires_grad=False)
        # Nothing here computes: one thread keeps the stage's host work (sampling, input
        # preparation) from spinning OpenMP workers against the other stages' processes.
        torch.set_num_threads(1)

    def forward(self, input_ids, positions, kv_caches, attn_metadata, intermediate_tensors=None):
        """Wait this stage's device time; return zeros of the real shapes."""
        tokens = int(input_ids.shape[0])
        rows = int(getattr(attn_metadata, "num_rows", tokens) or tokens)
        wait_s = self.timing.stage_seconds(rows, tokens, self.pp_size)
        t0 = time.perf_counter()
        time.sleep(wait_s)
        self.busy_s += time.perf_counter() - t0
        self.num_forwards += 1
        dev = self.anchor.device
        hidden = torch.zeros(tokens, self.hidden_size, dtype=self.dtype, device=dev)
        if self.pp_rank == self.pp_size - 1:
            return hidden  # [num_tokens, hidden]
        residual = torch.zeros(tokens, self.hidden_size, dtype=self.dtype, device=dev)
        return IntermediateTensors({"hidden_states": hidden, "residual": residual})

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Zero logits [rows, vocab] float32 for hidden [rows, hidden]."""
        return torch.zeros(hidden.shape[0], self.vocab_size, device=hidden.device)
