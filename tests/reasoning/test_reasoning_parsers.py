"""The think-tag reasoning parsers (vllm/reasoning: deepseek_r1, glm45, qwen3): the
one-shot split of finished replies by each parser's rule, and the streamed split: for
every way of cutting a reply into pieces (tags cut anywhere), the joined reasoning and
content deltas equal the one-shot split, and no delta ever carries a piece of a tag."""

import random

import pytest

from vllm.reasoning import get_reasoning_parser, reasoning_parser_names

CASES = [  # text, deepseek_r1's (reasoning, content), qwen3's
    ("<think>Let me add.</think>\n\nIt is 4.", ("Let me add.", "\n\nIt is 4."),
     ("Let me add.", "\n\nIt is 4.")),
    ("Let me add.</think>It is 4.", ("Let me add.", "It is 4."),
     (None, "Let me add.</think>It is 4.")),
    ("It is 4.", ("It is 4.", None), (None, "It is 4.")),
    ("<think>cut before the end", ("cut before the end", None), ("cut before the end", None)),
    ("\n<think>x</think>", ("x", None), ("x", None)),
    ("<think></think>Only content", (None, "Only content"), (None, "Only content")),
    ("<b>bold</b> answer", ("<b>bold</b> answer", None), (None, "<b>bold</b> answer")),
    ("<think>a</think>b</think>c", ("a", "b</think>c"), ("a", "b</think>c")),
    ("", (None, None), (None, None)),
    ("<thi", ("<thi", None), (None, "<thi")),  # finished: a cut tag is text
]  # fmt: skip


@pytest.mark.parametrize("text,r1,qwen3", CASES)
def test_extract(text, r1, qwen3):
    assert get_reasoning_parser("deepseek_r1").extract(text) == r1
    assert get_reasoning_parser("qwen3").extract(text) == qwen3
    assert get_reasoning_parser("glm45").extract(text) == qwen3  # qwen3's rule


def test_glm45_replies_with_and_without_thinking():
    """GLM-4.5 opens <think> itself; with thinking off its template puts an empty
    <think></think> in the prompt and the reply, without tags, is all content."""
    glm = get_reasoning_parser("glm45")
    assert glm.name == "glm45" and not glm.starts_in_reasoning
    assert glm.extract("<think>\nAdd them.\n</think>\nIt is 4.") == ("\nAdd them.\n", "\nIt is 4.")
    assert glm.extract("\nIt is 4.") == (None, "\nIt is 4.")
    call = "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
    assert glm.extract(f"<think>Use the tool.</think>{call}") == ("Use the tool.", call)
    assert glm.extract(call) == (None, call)
    # until_end_tag (a reply gated by its grammar) starts in reasoning, as qwen3's does
    assert glm.until_end_tag().extract("Add them.</think>4") == ("Add them.", "4")


def _streamed(parser, pieces):
    stream, thought, content = parser.stream(), [], []
    for k, piece in enumerate(pieces):
        r, c = stream.delta(piece, finished=k == len(pieces) - 1)
        thought.append(r)
        content.append(c)
    return thought, content


@pytest.mark.parametrize("name", reasoning_parser_names())
def test_stream_joins_to_extract_for_every_cut(name):
    parser = get_reasoning_parser(name)
    rng = random.Random(0)
    for text, *_ in CASES:
        if not text:
            continue
        cuts = [[text[:i], text[i:]] for i in range(len(text) + 1)]  # every single cut
        for _ in range(50):  # and random cuts into many pieces, one character up
            points = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 8))))
            cuts.append([text[a:b] for a, b in zip([0, *points], [*points, len(text)])])
        want = parser.extract(text)
        for pieces in cuts:
            thought, content = _streamed(parser, pieces)
            got = ("".join(thought) or None, "".join(content) or None)
            assert got == want, (text, pieces)
            if not any("<" in (part or "") or ">" in (part or "") for part in want):
                for d in thought + content:  # no piece of a removed tag leaks into a delta
                    assert "<" not in d and ">" not in d, (pieces, d)


def test_held_tail_is_released_when_it_is_not_a_tag():
    stream = get_reasoning_parser("deepseek_r1").stream()
    assert stream.delta("<think>2 </", False) == ("2 ", "")
    assert stream.delta("3", False) == ("</3", "")  # "</3" is no tag: released
    assert stream.delta("</think>", False) == ("", "")
    assert stream.delta("ok", True) == ("", "ok")


def test_unknown_name_lists_the_known():
    assert reasoning_parser_names() == ["deepseek_r1", "glm45", "qwen3"]
    with pytest.raises(ValueError, match=r"'x' is not known; use one of deepseek_r1, glm45, qwen3"):
        get_reasoning_parser("x")
