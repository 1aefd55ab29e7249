"""compare_two_settings: the server started with two CLI settings gives the same greedy
and seeded results (CPU float32: exact, TESTING.md), here for a different batch limit and
block size (batch composition and KV layout change, outputs must not)."""

from tests.utils import compare_two_settings


def test_batch_limit_and_block_size_do_not_change_outputs(smollm2_gguf):
    results = compare_two_settings(
        smollm2_gguf,
        [],
        ["--max-num-seqs", "2", "--block-size", "32"],
        prompts=("The capital of France is",),
        max_tokens=4,
    )
    greedy, seeded, chat = results[0][0]
    assert greedy.startswith(" Paris")
    assert len(seeded) == 2 and chat
