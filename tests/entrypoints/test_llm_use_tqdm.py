"""``use_tqdm`` of the offline LLM's methods takes a bool or, as upstream, a callable that
makes the progress bar (``functools.partial(tqdm, leave=False)``, a notebook tqdm): the
callable is called with tqdm's keyword arguments and its bar counts the finished prompts
(a callable used to be ignored, and a default tqdm bar shown instead)."""

import os

import pytest
from tqdm import tqdm

from vllm import LLM, SamplingParams
from vllm.entrypoints.llm import progress_bar
from vllm.sampling_params import BeamSearchParams

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


class _Recorder:
    """A progress-bar factory that records each bar it makes (writing to os.devnull)."""

    def __init__(self):
        self.bars: list[tuple[dict, tqdm]] = []

    def __call__(self, **kwargs):
        bar = tqdm(**kwargs, file=open(os.devnull, "w"))
        self.bars.append((kwargs, bar))
        return bar


def test_progress_bar_bool_and_callable():
    assert progress_bar(False, total=3).disable
    assert not progress_bar(True, total=3, file=open(os.devnull, "w")).disable
    rec = _Recorder()
    bar = progress_bar(rec, total=3, desc="x")
    assert rec.bars == [({"total": 3, "desc": "x"}, bar)] and not bar.disable


@pytest.mark.forked
def test_generate_chat_and_beam_search_call_the_factory(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, device="cpu", max_model_len=128)
    params = SamplingParams(max_tokens=3, temperature=0.0)
    rec = _Recorder()
    outs = llm.generate(["Hello", "World", "Again"], params, use_tqdm=rec)
    assert len(outs) == 3
    ((kwargs, bar),) = rec.bars
    assert kwargs["total"] == 3 and kwargs["desc"] == "Processed prompts"
    assert bar.n == 3  # every finished prompt counted on the caller's bar

    llm.chat([{"role": "user", "content": "Hi"}], params, use_tqdm=rec)
    assert len(rec.bars) == 2 and rec.bars[1][0]["total"] == 1 and rec.bars[1][1].n == 1

    llm.beam_search(["Hello"], BeamSearchParams(beam_width=2, max_tokens=2), use_tqdm=rec)
    kwargs, bar = rec.bars[2]
    assert kwargs == {"total": 2, "desc": "Beam search steps"} and bar.n == 2
