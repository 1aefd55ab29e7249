"""``--hf-config-path`` (upstream's flag): the model's config is read from another path
than ``--model``, as upstream documents for GGUF files whose metadata transformers cannot
turn into a (complete) config; the weights still come from the GGUF file.

Guards: the flag was missing (``vllm serve x.gguf --hf-config-path DIR`` failed with
"unrecognized arguments", ``LLM(..., hf_config_path=...)`` with a TypeError).
"""

import json
import os

import pytest

from tests.utils import check_outputs_equal, hf_greedy, vllm_greedy

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f"]
MAX_TOKENS = 24
CONFIG_MAX_LEN = 256  # the GGUF's llama.context_length is 512


def _config_only_dir(hf_dir: str, out) -> str:
    """A directory holding only ``hf_dir``'s config.json, with max_position_embeddings
    changed to CONFIG_MAX_LEN (so a config read from it is recognisable)."""
    with open(os.path.join(hf_dir, "config.json")) as fh:
        cfg = json.load(fh)
    cfg["max_position_embeddings"] = CONFIG_MAX_LEN
    out.mkdir()
    (out / "config.json").write_text(json.dumps(cfg))
    return str(out)


def test_flag_reads_the_config_from_the_given_directory(tiny_llama_dir, tiny_llama_gguf, tmp_path):
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils import FlexibleArgumentParser

    cfg_dir = _config_only_dir(tiny_llama_dir, tmp_path / "cfg")
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", tiny_llama_gguf, "--hf-config-path", cfg_dir])
    model_config = EngineArgs.from_cli_args(args).create_engine_config().model_config
    assert model_config.hf_config_path == cfg_dir
    assert model_config.max_model_len == CONFIG_MAX_LEN
    assert model_config.hf_config.architectures == ["LlamaForCausalLM"]
    assert model_config.load_format == "gguf"  # the weights still come from the file
    default = EngineArgs(model=tiny_llama_gguf).create_engine_config().model_config
    assert default.hf_config_path is None and default.max_model_len == 512


def test_missing_config_path_is_refused(tiny_llama_gguf, tmp_path):
    from vllm.engine.arg_utils import EngineArgs

    missing = str(tmp_path / "absent")
    with pytest.raises(ValueError, match=r"hf_config_path '.*absent' does not exist"):
        EngineArgs(model=tiny_llama_gguf, hf_config_path=missing).create_engine_config()


@pytest.mark.forked
def test_gguf_weights_with_the_directory_config_match_transformers(
    tiny_llama_dir, tiny_llama_gguf, tmp_path
):
    """Greedy tokens of the GGUF's weights under the directory's config equal
    transformers' on the directory's checkpoint (the same float32 weights)."""
    from vllm import LLM

    cfg_dir = _config_only_dir(tiny_llama_dir, tmp_path / "cfg")
    ref = hf_greedy(tiny_llama_dir, PROMPTS, MAX_TOKENS)
    for ids, _, _ in ref:  # distinct-token guard (docs/design.md)
        assert len(set(ids)) >= 4, f"degenerate output {ids}"
    llm = LLM(model=tiny_llama_gguf, hf_config_path=cfg_dir, device="cpu", dtype="float32")
    assert llm.llm_engine.model_config.max_model_len == CONFIG_MAX_LEN
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS)
    llm.llm_engine.shutdown()
    check_outputs_equal(ref, out, "hf-dir", "gguf+hf_config_path", PROMPTS)
