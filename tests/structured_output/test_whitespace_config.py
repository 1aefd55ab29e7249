"""The engine-wide ``structured_outputs_config`` key ``disable_any_whitespace`` (upstream's
``StructuredOutputsConfig``): every JSON constraint of the engine compiles without free
whitespace, as if each request had set its own option; regex, choice and grammar
constraints are untouched.

Guards the failure where ``--structured-outputs-config '{"disable_any_whitespace": true}'``
was refused as not implemented although the per-request option was."""

import json
import re

import pytest

from vllm import LLM, SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import GuidedDecodingParams, StructuredOutputsParams

# No strings: a compact grammar allows only xgrammar's fixed separators ", " and ": ".
DIGITS = {
    "type": "object",
    "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 9},
        "b": {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 3},
    },
    "required": ["a", "b"],
    "additionalProperties": False,
}
COMPACT = r'\{"a": [0-9], "b": \[(true|false)(, (true|false)){0,2}\]\}'


def test_config_key_reaches_the_decoding_config(tiny_llama_dir):
    def decoding(**kw):
        args = EngineArgs(model=tiny_llama_dir, device="cpu", **kw)
        return args.create_engine_config().decoding_config

    assert decoding().disable_any_whitespace is False
    on = decoding(structured_outputs_config={"disable_any_whitespace": True})
    assert (on.disable_any_whitespace, on.guided_decoding_backend) == (True, "xgrammar")
    off = decoding(structured_outputs_config='{"disable_any_whitespace": false}')
    assert off.disable_any_whitespace is False
    with pytest.raises(ValueError, match="disable_any_whitespace='yes' is not supported"):
        decoding(structured_outputs_config={"disable_any_whitespace": "yes"})


@pytest.mark.forked
def test_engine_wide_compact_json(tiny_llama_dir):
    llm = LLM(
        tiny_llama_dir,
        max_model_len=256,
        seed=0,
        structured_outputs_config={"disable_any_whitespace": True},
    )
    json_gd = GuidedDecodingParams(json=DIGITS)
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=60, guided_decoding=json_gd)
        for s in range(6)
    ]
    obj = StructuredOutputsParams(json_object=True)
    params.append(SamplingParams(temperature=0, max_tokens=30, structured_outputs=obj))
    regex = GuidedDecodingParams(regex=r"[a-z]{2} [0-9]{2}")  # its space is the regex's
    params.append(SamplingParams(temperature=0, max_tokens=20, guided_decoding=regex))
    outs = [o.outputs[0] for o in llm.generate(["JSON:"] * len(params), params, use_tqdm=False)]
    for out in outs[:6]:
        assert out.finish_reason == "stop" and re.fullmatch(COMPACT, out.text), out.text
        json.loads(out.text)
    assert not re.search(r"\s", outs[6].text.split('"')[0]), outs[6].text  # "{" then a key
    assert re.fullmatch(r"[a-z]{2} [0-9]{2}", outs[7].text), outs[7].text
    # the grammars compiled are the compact ones (the cache key's last field)
    keys = set(llm.llm_engine.guided.cache._futures)
    assert (json_gd.key()[0], json_gd.key()[1], True) in keys
    assert ("json_object", "", True) in keys and regex.key() in keys
    assert (json_gd.key()[0], json_gd.key()[1], False) not in keys
    llm.llm_engine.shutdown()
