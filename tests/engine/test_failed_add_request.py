"""A request whose ``add_request`` raises after its checks passed leaves nothing behind.

The request used to be entered in the engine's request table before its grammar matchers
were made and it was queued; when either raised (a matcher that could not be created),
the entry and the matchers stayed: ``has_request`` stayed True, the same id was refused
as "already running" for a request that never ran, and the matchers were never freed.
"""

import random

import pytest

from tests.utils import completion_tuple

PROMPT = {"prompt_token_ids": [random.Random(5).randrange(10, 300) for _ in range(20)]}


@pytest.mark.forked
def test_a_failed_add_request_keeps_no_id_and_no_matcher(tiny_llama_dir):
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.engine.llm_engine import LLMEngine
    from vllm.model_executor.guided_decoding.manager import GuidedDecodingManager
    from vllm.sampling_params import GuidedDecodingParams

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=tiny_llama_dir, device="cpu", max_model_len=128, num_gpu_blocks_override=32
        )
    )
    guided = SamplingParams(
        temperature=0.0, max_tokens=6, guided_decoding=GuidedDecodingParams(regex="[a-z]{3,20}")
    )
    engine.guided.grammar_future(guided).result()  # compiled: add_request starts matchers
    real_start = GuidedDecodingManager.start

    def failing_start(self, group, compiled):
        real_start(self, group, compiled)  # the matchers exist when it fails
        raise MemoryError("injected matcher failure")

    GuidedDecodingManager.start = failing_start
    with pytest.raises(MemoryError, match="injected matcher failure"):
        engine.add_request("req", PROMPT, guided)
    GuidedDecodingManager.start = real_start
    assert not engine.has_request("req")
    assert not engine.guided.active, "the failed request's matchers were kept"
    assert not engine.has_unfinished_requests()

    # the id is free again, and the request runs as if the failure never happened
    engine.add_request("req", PROMPT, guided)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.finished]
    ids, text, _ = completion_tuple(outs[0])
    assert [o.request_id for o in outs] == ["req"]
    assert text and text.isalpha() and text.islower() and len(ids) >= 3, (ids, text)
    assert not engine.guided.active
    engine.shutdown()
