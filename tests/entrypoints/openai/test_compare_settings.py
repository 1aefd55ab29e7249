"""compare_two_settings: the server started with two CLI settings gives the same greedy
and seeded results (CPU float32: exact, docs/design.md), here for a different batch limit and
block size (batch composition and KV layout change, outputs must not).

Every comparison's first setting is the default server: one module-scoped server answers
for all of them (its answers do not depend on what it served before: greedy, per-request
seeds, no prefix caching), so each test starts only the server of its second setting.
"""

import re
import urllib.request

import pytest

from tests.utils import RemoteOpenAIServer, compare_two_settings

# One xdist worker runs this module (.ci/run: --dist loadgroup), so its module-scoped
# default server starts once, not once per worker.
pytestmark = pytest.mark.xdist_group("test_compare_settings")

BASE_ARGS = ("--device", "cpu", "--max-model-len", "512")


@pytest.fixture(scope="module")
def default_server(smollm2_gguf):
    """``vllm serve SMOLLM2 --device cpu --max-model-len 512``, shared by the module."""
    with RemoteOpenAIServer(smollm2_gguf, BASE_ARGS) as server:
        yield server


def _generation_tokens(server: RemoteOpenAIServer) -> float:
    """The server's ``vllm:generation_tokens_total`` counter."""
    metrics = urllib.request.urlopen(server.url_for("metrics")).read().decode()
    counted = re.search(r"^vllm:generation_tokens_total\{[^}]*\} (\S+)", metrics, re.M)
    assert counted, metrics[-2000:]
    return float(counted.group(1))


def test_batch_limit_and_block_size_do_not_change_outputs(smollm2_gguf, default_server):
    results = compare_two_settings(
        smollm2_gguf,
        [],
        ["--max-num-seqs", "2", "--block-size", "32"],
        prompts=("The capital of France is",),
        max_tokens=4,
        server1=default_server,
    )
    greedy, seeded, chat = results[0][0]
    assert greedy.startswith(" Paris")
    assert len(seeded) == 2 and chat


def test_pipeline_parallel_server_equals_pp1(smollm2_gguf, default_server):
    """`vllm serve --pipeline-parallel-size 2` (mp executor, 2 virtual engines) answers
    exactly as PP=1 on CPU float32, greedy and seeded."""
    results = compare_two_settings(
        smollm2_gguf,
        [],
        ["--pipeline-parallel-size", "2"],
        prompts=("The capital of France is",),
        max_tokens=6,
        env={"VLLM_CPU_KVCACHE_SPACE": "0.1"},
        server1=default_server,
    )
    assert results[1][0][0].startswith(" Paris")


def test_ngram_speculation_server_equals_no_speculation(smollm2_gguf, default_server):
    """`vllm serve --speculative-model [ngram] --num-speculative-tokens 4`: greedy text
    equal to the server without speculation (seeded sampling draws differently, by design)."""
    prompt = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,"
    results = compare_two_settings(
        smollm2_gguf,
        [],
        ["--speculative-model", "[ngram]", "--num-speculative-tokens", "4",
         "--ngram-prompt-lookup-max", "3"],
        prompts=(prompt,),
        max_tokens=10,
        seeded=False,
        server1=default_server,
    )  # fmt: skip
    assert results[1][0][0].startswith(" 3, 4, 5"), results


def test_multi_step_server_equals_one_step(smollm2_gguf, default_server):
    """`vllm serve --num-scheduler-steps 4`: greedy, seeded (n=2) and chat outputs equal the
    one-token-step server; a streamed completion (several tokens per engine step) joins to
    the same text; the generation-token counter counts every token."""

    def streams_and_counts(server: RemoteOpenAIServer) -> None:
        client = server.get_client()
        name = client.models.list().data[0].id
        prompt = "Hello, my name is"
        before = _generation_tokens(server)
        whole = client.completions.create(model=name, prompt=prompt, max_tokens=9, temperature=0.0)
        stream = client.completions.create(
            model=name, prompt=prompt, max_tokens=9, temperature=0.0, stream=True
        )
        pieces = [c.choices[0].text for c in stream if c.choices]
        assert "".join(pieces) == whole.choices[0].text
        assert whole.usage.completion_tokens == 9
        assert _generation_tokens(server) - before == 18.0

    results = compare_two_settings(
        smollm2_gguf,
        [],
        ["--num-scheduler-steps", "4"],
        server1=default_server,
        on_server2=streams_and_counts,
    )
    assert results[1][0][0].startswith(" Paris")
