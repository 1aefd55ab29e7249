"""Our Llama/Qwen2 forward equals Hugging Face's on CPU in float32.

The model runs through the TORCH_SDPA attention backend with a paged KV cache: a prefill
over the prompt, then one decode step per new token, exactly as the engine drives it.
Random tiny models use a large init std, and the tests assert that greedy outputs contain
several distinct tokens (docs/design.md), so equality is meaningful.
"""

import pytest
import torch
from tiny_models import load_hf_config, load_hf_model

from vllm.attention.backends.abstract import ForwardMode, StepInputs
from vllm.attention.backends.torch_sdpa import TorchSDPABackend
from vllm.model_executor.layers.rotary_embedding import compute_inv_freq, get_rope_parameters
from vllm.model_executor.model_loader import get_model

BLOCK_SIZE = 16
NUM_BLOCKS = 8  # + 1 scratch block
PROMPT = [1, 504, 3458, 282, 4649, 314, 1812, 30, 2, 17, 9000, 77]
NEW_TOKENS = 8


def _sdpa() -> TorchSDPABackend:
    """A TORCH_SDPA backend instance; metadata building only uses block size and device."""
    from vllm.attention.backends.abstract import AttentionSpec

    spec = AttentionSpec(1, 1, 1, BLOCK_SIZE, torch.float32, torch.device("cpu"))
    return TorchSDPABackend(spec)


class Runner:
    """Drives one pipeline of stages (a list of models) over a single sequence."""

    def __init__(self, stages: list[torch.nn.Module]):
        self.stages = stages
        self.caches = []
        for model in stages:
            cfg = model.config
            head_dim = cfg.hidden_size // cfg.num_attention_heads
            shape = TorchSDPABackend.get_kv_cache_shape(
                NUM_BLOCKS + 1, BLOCK_SIZE, cfg.num_key_value_heads, head_dim
            )
            n = model.end_layer - model.start_layer
            self.caches.append([torch.zeros(shape) for _ in range(n)])

    def step(self, token_ids: list[int], start: int) -> torch.Tensor:
        """Run tokens at positions [start, start + len); return last-token logits [vocab]."""
        n = len(token_ids)
        end = start + n
        mode = ForwardMode.PREFILL if start == 0 else ForwardMode.DECODE
        step = StepInputs(
            mode=mode,
            seq_lens=[end],
            query_lens=[n],
            block_tables=[list(range((end + BLOCK_SIZE - 1) // BLOCK_SIZE))],
            slot_mapping=list(range(start, end)),
            num_real_rows=1,
        )
        md = _sdpa().build_metadata(step, NUM_BLOCKS * BLOCK_SIZE)
        ids = torch.tensor(token_ids, dtype=torch.long)
        positions = torch.arange(start, end, dtype=torch.long)
        out = None
        with torch.no_grad():
            for model, caches in zip(self.stages, self.caches):
                out = model(ids, positions, caches, md, intermediate_tensors=out)
            return self.stages[-1].compute_logits(out)  # [n, vocab]

    def generate(self, prompt: list[int], max_new: int) -> tuple[list[int], torch.Tensor]:
        logits = self.step(prompt, 0)
        prompt_logits = logits
        tokens = [int(logits[-1].argmax())]
        for _ in range(max_new - 1):
            logits = self.step([tokens[-1]], len(prompt) + len(tokens) - 1)
            tokens.append(int(logits[-1].argmax()))
        return tokens, prompt_logits


def load(path: str, pp_size: int = 1) -> list[torch.nn.Module]:
    from types import SimpleNamespace

    hf_config = load_hf_config(path)
    cfg = SimpleNamespace(
        model=path,
        hf_config=hf_config,
        dtype=torch.float32,
        load_format="auto",
        seed=0,
        max_model_len=None,
    )
    return [get_model(cfg, "cpu", rank, pp_size) for rank in range(pp_size)]


def hf_reference(path: str, prompt: list[int], max_new: int):
    """(greedy new tokens, prompt logits [len(prompt), vocab]) from transformers."""
    model = load_hf_model(path)
    ids = torch.tensor([prompt])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        out = model.generate(
            ids, max_new_tokens=max_new, do_sample=False, eos_token_id=None, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist(), logits


@pytest.mark.parametrize(
    "fixture", ["tiny_llama_dir", "tiny_llama_tied_dir", "tiny_qwen2_dir", "tiny_llama_gguf"]
)
def test_matches_transformers(fixture, request):
    path = request.getfixturevalue(fixture)
    ours, our_logits = Runner(load(path)).generate(PROMPT, NEW_TOKENS)
    theirs, hf_logits = hf_reference(path, PROMPT, NEW_TOKENS)
    assert len(set(theirs)) >= 3, f"degenerate reference output {theirs}"
    # Same arithmetic except fused matmuls and SDPA vs HF's attention kernel: tiny drift only.
    torch.testing.assert_close(our_logits, hf_logits, atol=1e-4, rtol=1e-4)
    assert ours == theirs


@pytest.mark.parametrize("pp_size", [2, 3])
def test_pipeline_split_is_exact(tiny_llama_dir, pp_size):
    full_tokens, full_logits = Runner(load(tiny_llama_dir)).generate(PROMPT, NEW_TOKENS)
    pp_tokens, pp_logits = Runner(load(tiny_llama_dir, pp_size)).generate(PROMPT, NEW_TOKENS)
    assert torch.equal(full_logits, pp_logits)
    assert full_tokens == pp_tokens


def test_first_stage_returns_intermediate_tensors(tiny_qwen2_dir):
    first, last = load(tiny_qwen2_dir, pp_size=2)
    runner = Runner([first])
    step = StepInputs(ForwardMode.PREFILL, [3], [3], [[0]], [0, 1, 2], 1)
    md = _sdpa().build_metadata(step, NUM_BLOCKS * BLOCK_SIZE)
    with torch.no_grad():
        out = first(torch.tensor([5, 6, 7]), torch.arange(3), runner.caches[0], md)
    assert out["hidden_states"].shape == out["residual"].shape == (3, 64)
    with pytest.raises(RuntimeError, match="not the last stage"):
        first.compute_logits(out["hidden_states"])


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default", "rope_theta": 10000.0},
        {"rope_type": "linear", "rope_theta": 500000.0, "factor": 4.0},
        {
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ],
)
def test_inv_freq_matches_transformers(rope_parameters):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_parameters=rope_parameters)
    params = get_rope_parameters(config)
    ours = compute_inv_freq(64, params)
    if params["rope_type"] == "default":
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        theirs, _ = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    else:
        theirs, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, "cpu")
    assert torch.equal(ours, theirs)


def test_legacy_rope_fields():
    from types import SimpleNamespace

    legacy = SimpleNamespace(rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    assert get_rope_parameters(legacy) == {
        "type": "linear",
        "factor": 2.0,
        "rope_theta": 5e5,
        "rope_type": "linear",
    }


def test_smollm2_says_paris(smollm2_gguf):
    from tiny_models import load_smollm2_tokenizer

    tokenizer = load_smollm2_tokenizer()
    prompt = tokenizer("The capital of France is")["input_ids"]
    ours, _ = Runner(load(smollm2_gguf)).generate(prompt, 4)
    assert tokenizer.decode(ours).startswith(" Paris"), tokenizer.decode(ours)
