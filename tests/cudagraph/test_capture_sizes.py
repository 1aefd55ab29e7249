"""The capture-size rule of docs/design.md, exactly, and that every runnable batch pads to a
captured size or is eager by the rule."""

import pytest

from vllm.config import CompilationConfig
from vllm.cudagraph.sizes import capture_sizes, prefill_capture_sizes, warn_eager_sizes

EXAMPLES = {
    (1, 0, 512): [1],
    (2, 0, 512): [1, 2],
    (3, 0, 512): [1, 2, 3],
    (5, 0, 512): [1, 2, 4, 5],
    (7, 0, 512): [1, 2, 4, 7],
    (8, 0, 512): [1, 2, 4, 8],
    (12, 0, 512): [1, 2, 4, 8, 12],
    (100, 0, 512): [1, 2, 4, *range(8, 100, 8), 100],
    (256, 0, 512): [1, 2, 4, *range(8, 257, 8)],
    (300, 0, 512): [1, 2, 4, *range(8, 297, 8), 300],
    (8, 4, 512): [1, 2, 4, 8, 16, 24, 32, 40],
    (3, 4, 512): [1, 2, 4, 8, 15],
    (16, 1, 512): [1, 2, 4, 8, 16, 24, 32],
    (64, 4, 512): [1, 2, 4, *range(8, 320, 8), 320],
    (8, 4, 16): [1, 2, 4, 8, 16],
    (300, 0, 256): [1, 2, 4, *range(8, 257, 8)],
    (64, 4, 100): [1, 2, 4, *range(8, 100, 8), 100],
    (3, 4, 10): [1, 2, 4, 8, 10],
}


@pytest.mark.parametrize("args,expected", list(EXAMPLES.items()), ids=str)
def test_rule_examples(args, expected):
    max_num_seqs, k, ceiling = args
    cs = capture_sizes(max_num_seqs, k, ceiling)
    assert list(cs.sizes) == expected
    assert cs.max_batchsize_to_capture == expected[-1]
    assert list(cs.sizes) == sorted(set(cs.sizes))
    # every batch the scheduler can produce pads to a captured size, or is eager by the rule
    for b in range(1, max_num_seqs * (k + 1) + 1):
        padded = cs.padded_size(b)
        if b <= cs.max_batchsize_to_capture:
            assert padded == min(s for s in cs.sizes if s >= b)
        else:
            assert padded is None


def test_enforce_eager_and_explicit_sizes():
    cs = capture_sizes(8, 0, 512, enforce_eager=True)
    assert cs.sizes == () and cs.max_batchsize_to_capture == 0 and cs.padded_size(1) is None
    cs = capture_sizes(64, 0, 512, cuda_graph_sizes=[16, 4, 4, 1])
    assert cs.sizes == (1, 4, 16) and cs.max_batchsize_to_capture == 16
    assert cs.padded_size(5) == 16 and cs.padded_size(17) is None
    msg = warn_eager_sizes(cs)
    assert "17-64" in msg and "up to batch size 16" in msg


def test_eager_warning_names_sizes():
    assert warn_eager_sizes(capture_sizes(8, 4, 512)) is None
    msg = warn_eager_sizes(capture_sizes(64, 0, 16))
    assert "17-64" in msg


@pytest.mark.parametrize("bad", [dict(max_num_seqs=0), dict(num_speculative_tokens=-1)])
def test_rule_rejects_bad_values(bad):
    kw = dict(max_num_seqs=8, num_speculative_tokens=0)
    kw.update(bad)
    with pytest.raises(ValueError):
        capture_sizes(**kw)


PREFILL_EXAMPLES = {
    0: [],
    1: [1],
    16: [16],
    17: [16, 17],
    100: [16, 24, 32, 48, 64, 96, 100],
    1024: [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024],
    2000: [16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2000],
}


@pytest.mark.parametrize("max_tokens,expected", list(PREFILL_EXAMPLES.items()), ids=str)
def test_prefill_rule_examples(max_tokens, expected):
    sizes = prefill_capture_sizes(max_tokens)
    assert list(sizes) == expected
    # every prompt up to the maximum pads by less than half its length (16 at least)
    for n in range(1, max_tokens + 1):
        padded = next(s for s in sizes if s >= n)
        assert padded - n < max(16, n / 2), (n, padded)


def test_prefill_maximum_from_the_config():
    assert CompilationConfig().prefill_graph_max_tokens == 512
    cc = CompilationConfig(prefill_graph_max_tokens=0)
    assert cc.prefill_graph_max_tokens == 0 and prefill_capture_sizes(0) == ()
    for bad in (-1, -7):
        with pytest.raises(ValueError, match=f"prefill_graph_max_tokens must be >= 0.*got {bad}"):
            CompilationConfig(prefill_graph_max_tokens=bad)
    with pytest.raises(ValueError, match="got -3"):
        prefill_capture_sizes(-3)


@pytest.mark.parametrize("max_tokens", [0, 1, 100, 256, 257, 512, 1000, 4096])
def test_piecewise_ladder(max_tokens):
    """The prefill ladder up to 256 tokens, then multiples of 256, then the maximum: a step
    pads by less than half its length below 256 tokens and by less than 256 above."""
    from vllm.cudagraph.sizes import piecewise_capture_sizes

    sizes = piecewise_capture_sizes(max_tokens)
    assert list(sizes) == sorted(set(sizes)) and (sizes[-1] if sizes else 0) == max_tokens
    for n in range(1, max_tokens + 1):
        padded = next(s for s in sizes if s >= n)
        assert padded - n < (max(16, n / 2) if n <= 256 else 256), (n, padded)
    if max_tokens == 1000:
        assert sizes == (16, 24, 32, 48, 64, 96, 128, 192, 256, 512, 768, 1000)


def test_piecewise_sizes_from_the_config(tiny_llama_dir):
    """The piecewise ladder up to min(--piecewise-graph-max-tokens, max_num_batched_tokens)
    at PP = 1, none at PP > 1 or with the flag at its default 0; a negative value is
    refused."""
    from vllm.cudagraph.sizes import graph_spec
    from vllm.engine.arg_utils import EngineArgs

    def spec(pp=1, **kw):
        cfg = EngineArgs(model=tiny_llama_dir, device="cpu", **kw).create_engine_config()
        return graph_spec(cfg, pp, True, 8).piecewise_sizes

    assert CompilationConfig().piecewise_graph_max_tokens == 0 and spec() == ()
    assert spec(piecewise_graph_max_tokens=100) == (16, 24, 32, 48, 64, 96, 100)
    chunked = dict(enable_chunked_prefill=True, max_num_batched_tokens=48, max_num_seqs=8)
    assert spec(piecewise_graph_max_tokens=512, **chunked) == (16, 24, 32, 48)
    assert spec(2, piecewise_graph_max_tokens=100) == ()
    with pytest.raises(ValueError, match="piecewise_graph_max_tokens must be >= 0.*got -1"):
        CompilationConfig(piecewise_graph_max_tokens=-1)


def test_loop_graphs_only_at_one_rank_and_one_stage(tiny_llama_dir):
    """Decode-loop sizes (and their steps) with multi-step decoding at PP = TP = 1; none at
    TP = 2, where rank 0's sampled ids must reach the other rank between passes, or at PP = 2,
    where the stages run a call's passes."""
    from vllm.cudagraph.sizes import graph_spec
    from vllm.engine.arg_utils import EngineArgs

    def spec(pp=1, **kw):
        cfg = EngineArgs(model=tiny_llama_dir, device="cpu", num_scheduler_steps=8,
                         max_num_seqs=8, **kw).create_engine_config()  # fmt: skip
        s = graph_spec(cfg, pp, True, 8)
        return s.loop_sizes, s.loop_steps

    sizes, steps = spec()
    assert sizes and steps == 8
    assert spec(tensor_parallel_size=2) == ((), 0)
    assert spec(2, pipeline_parallel_size=2) == ((), 0)
