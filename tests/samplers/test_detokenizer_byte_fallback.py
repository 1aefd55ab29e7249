"""Detokenization with a Llama-style SentencePiece tokenizer (byte fallback, "▁" word
prefixes; tests/models/tiny_tokenizers.py), against transformers' decode of the same ids.

Such a tokenizer drops the space of a word-initial token that starts a decode ("▁world"
alone decodes as "world"), so an output's text is what the prompt's decode grows by when
the output ids follow it, as upstream vLLM makes it: "Hello" + " world".
"""

import os
import random

import pytest
import tiny_tokenizers

from vllm import LLM, SamplingParams
from vllm.engine.detokenizer import decode_sequence_step, finish_text
from vllm.engine.stop_checker import check_stop
from vllm.engine.token_text import fill_decoded_tokens
from vllm.entrypoints.openai.completion_logprobs import completion_logprobs
from vllm.sampling_params import RequestOutputKind
from vllm.sequence import Logprob, Sequence, SequenceStatus

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

REPL = "\ufffd"
OUTPUT = tiny_tokenizers.CHAIN_TEXT[len("Hello") :]  # " world €😀世界"


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizers.byte_fallback_tokenizer()


@pytest.fixture(scope="module")
def chain_ids(tok):
    """(prompt ids [<s>, ▁Hello], output ids of " world €😀世界" without EOS)."""
    ids = tok.encode(tiny_tokenizers.CHAIN_TEXT)
    assert tok.convert_ids_to_tokens(ids[:4]) == ["<s>", "▁Hello", "▁world", "▁"]
    assert tok.convert_ids_to_tokens(ids[4:7]) == ["<0xE2>", "<0x82>", "<0xAC>"]
    return ids[:2], ids[2:]


def _after(tok, prompt, ids):
    """What transformers' decode of ``prompt`` grows by when ``ids`` follow it."""
    before, full = (
        tok.decode(prompt, skip_special_tokens=True),
        tok.decode(prompt + ids, skip_special_tokens=True),
    )
    assert full.startswith(before)
    return full[len(before) :]


def _stream(tok, prompt, ids, params):
    """Feed ``ids`` one by one with the stop checks; return (sequence, texts after each)."""
    seq = Sequence(0, None, prompt, 16, eos_token_id=tok.eos_token_id)
    texts = []
    for t in ids:
        seq.append_token_id(t, {t: Logprob(-1.0)})
        check_stop(seq, decode_sequence_step(tok, seq, params), params, 10**6, tok)
        texts.append(seq.output_text)
        if seq.is_finished():
            break
    return seq, texts


def test_output_text_continues_the_prompt(tok, chain_ids):
    """Streamed after "Hello", " world" keeps its space; after every token the text is
    transformers' text of prompt + output less the prompt's, whenever that ends on a
    complete character, and never anything else; the final text is " world €😀世界"."""
    prompt, ids = chain_ids
    params = SamplingParams(max_tokens=len(ids))
    seq, texts = _stream(tok, prompt, ids, params)
    assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
    assert texts[0] == " world" and texts[1] == " world "
    for k, text in enumerate(texts, 1):
        ref = _after(tok, prompt, ids[:k])
        assert OUTPUT.startswith(text), (k, text)
        if not ref.endswith(REPL):
            assert text == ref, (k, text, ref)
    assert seq.output_text == OUTPUT == _after(tok, prompt, ids)


def test_stops_and_one_shot_text_continue_the_prompt(tok, chain_ids):
    """A stop token right after " world " (the first byte of "€"), EOS, and a text made
    only when the sequence finishes (async output processing) keep the space too."""
    prompt, ids = chain_ids
    seq, _ = _stream(tok, prompt, ids, SamplingParams(stop_token_ids=[ids[2]]))
    assert seq.stop_reason == ids[2] and seq.output_text == " world "
    seq, _ = _stream(tok, prompt, ids + [tok.eos_token_id], SamplingParams(max_tokens=50))
    assert seq.status == SequenceStatus.FINISHED_STOPPED and seq.output_text == OUTPUT
    seq = Sequence(0, None, prompt, 16, eos_token_id=tok.eos_token_id)
    for t in ids:
        seq.append_token_id(t, {t: Logprob(-1.0)})
    finish_text(tok, seq, SamplingParams(), drop_last=False)
    assert seq.output_text == OUTPUT


def test_length_cap_inside_a_byte_run_keeps_complete_characters(tok, chain_ids):
    """Cut after the first byte of "😀": transformers decodes the byte run
    ``<0xE2><0x82><0xAC><0xF0>`` as four U+FFFD, but "€" was complete (and streamed); the
    final text keeps it and drops only the incomplete "😀", streamed or made at the end;
    and after the first byte of "界", "世" stays too."""
    prompt, ids = chain_ids
    for n, want in ((7, " world €"), (len(ids) - 2, " world €😀世")):
        assert _after(tok, prompt, ids[:n]) == " world " + REPL * (n - 2)
        seq, texts = _stream(tok, prompt, ids[:n], SamplingParams(max_tokens=n))
        assert seq.status == SequenceStatus.FINISHED_LENGTH_CAPPED
        assert texts[-2] == want and seq.output_text == want
        seq = Sequence(0, None, prompt, 16, eos_token_id=tok.eos_token_id)
        for t in ids[:n]:
            seq.append_token_id(t, {t: Logprob(-1.0)})
        finish_text(tok, seq, SamplingParams(), drop_last=False)
        assert seq.output_text == want


def test_invalid_byte_run_neither_stalls_nor_takes_text_back(tok, chain_ids):
    """A stray continuation byte after "😀" makes transformers decode the whole byte run
    "€😀" + 0x85 as eight U+FFFD. The streamed text keeps "€😀", goes on with the words
    after the stray byte as they come, and the final text, streamed or made only at the
    end, is the streamed one."""
    prompt, ids = chain_ids
    out = ids[:9] + [3 + 0x85] + tok.encode("Hello there", add_special_tokens=False)
    assert _after(tok, prompt, out) == " world " + REPL * 8 + " Hello there"
    seq, texts = _stream(tok, prompt, out, SamplingParams(max_tokens=len(out)))
    want = " world €😀" + REPL + " Hello there"
    assert texts[9] == " world €😀" and texts[10] == " world €😀" + REPL + " Hello"
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])) and texts[-1] == want
    seq = Sequence(0, None, prompt, 16, eos_token_id=tok.eos_token_id)
    for t in out:
        seq.append_token_id(t, {t: Logprob(-1.0)})
    finish_text(tok, seq, SamplingParams(), drop_last=False)
    assert seq.output_text == want


def test_skipped_special_tokens_keep_spaces_and_leave_the_window(tok):
    """With ``skip_special_tokens`` a run of text-less tokens (EOS under ``ignore_eos``)
    neither drops the space of the word after it nor stays in the decoded window (which
    would grow with every such token)."""
    word, again = tok.convert_tokens_to_ids(["▁world", "▁Hello"])
    eos = tok.eos_token_id
    out = [word] + [eos] * 50 + [again, tok.bos_token_id, word]
    params = SamplingParams(max_tokens=len(out), ignore_eos=True)
    seq = Sequence(0, None, tok.encode("Hello"), 16, eos_token_id=eos)
    widest = 0
    for t in out:
        seq.append_token_id(t, {t: Logprob(-1.0)})
        check_stop(seq, decode_sequence_step(tok, seq, params), params, 10**6, tok)
        widest = max(widest, len(seq.output_token_ids) - seq.prefix_offset)
    assert seq.output_text == " world Hello world" == _after(tok, tok.encode("Hello"), out)
    assert widest <= 2


@pytest.mark.parametrize("stop", [False, True])
def test_random_streams_equal_one_shot_text(tok, stop):
    """300 random output streams (words, byte tokens of valid and broken characters,
    specials): the streamed text only grows, the final text is the same streamed or made
    at the end, has no trailing U+FFFD, and equals transformers' text whenever that holds
    no U+FFFD; with EOS allowed to stop the stream its text is left out."""
    rng = random.Random(stop)
    words = [i for i in range(259, len(tok))]
    chars = [tok.encode(c, add_special_tokens=False)[1:] for c in "€😀世界é"]
    prompt = tok.encode("Hello")
    for _ in range(300):
        ids = []
        while len(ids) < 20:
            r = rng.random()
            if r < 0.4:
                ids.append(rng.choice(words))
            elif r < 0.7:
                ids += rng.choice(chars)
            elif r < 0.9:
                ids.append(3 + rng.randrange(128, 256))
            else:
                ids.append(rng.choice([1, 2]))
        params = SamplingParams(max_tokens=len(ids), ignore_eos=not stop)
        seq, texts = _stream(tok, prompt, ids, params)
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), (ids, texts)
        final = seq.output_text
        assert not final.endswith(REPL) and final.startswith(texts[-2] if len(texts) > 1 else "")
        n = seq.get_output_len()
        one_shot = Sequence(0, None, prompt, 16, eos_token_id=tok.eos_token_id)
        for t in ids[:n]:
            one_shot.append_token_id(t, {t: Logprob(-1.0)})
        stopped = seq.status == SequenceStatus.FINISHED_STOPPED  # by EOS
        finish_text(tok, one_shot, params, drop_last=stopped)
        assert one_shot.output_text == final, (ids[:n], final, one_shot.output_text)
        ref = _after(tok, prompt, ids[: n - 1] if stopped else ids[:n])
        if REPL not in ref:
            assert final == ref, (ids[:n], final, ref)


def test_logprob_token_texts_keep_word_start_spaces(tok):
    """A logprobs entry's text is the token's decode with the space restored that a
    SentencePiece decode strips from a word-initial piece: "▁Hello" and "Hello" are
    " Hello" and "Hello", two keys of a completion's top_logprobs rather than one; "▁" is
    " "; a byte of "€" is U+FFFD; a special token keeps its text."""
    ids = tok.convert_tokens_to_ids(["▁Hello", "Hello", "▁", "<0xE2>", "</s>"])
    pos = {t: Logprob(-1.0 - i, rank=i + 1) for i, t in enumerate(ids)}
    fill_decoded_tokens(tok, [None, pos])
    assert [pos[t].decoded_token for t in ids] == [" Hello", "Hello", " ", REPL, "</s>"]
    out = completion_logprobs([ids[0]], [pos], 5, 0, lambda t, lp: lp.decoded_token)
    assert out.tokens == [" Hello"]
    assert out.top_logprobs[0] == {
        " Hello": -1.0,
        "Hello": -2.0,
        " ": -3.0,
        REPL: -4.0,
        "</s>": -5.0,
    }


@pytest.mark.forked
def test_llm_text_continues_the_prompt(tiny_byte_fallback_chain_dir, tok, chain_ids):
    """LLM.generate and a streamed (DELTA) request through LLMEngine: prompt + output text
    is transformers' decode of prompt + output ids."""
    prompt, ids = chain_ids
    llm = LLM(tiny_byte_fallback_chain_dir, device="cpu", max_model_len=128)
    greedy = SamplingParams(temperature=0.0, max_tokens=30)
    out = llm.generate("Hello", greedy, use_tqdm=False)[0]
    assert out.prompt_token_ids == prompt
    assert list(out.outputs[0].token_ids) == ids + [tok.eos_token_id]
    assert out.outputs[0].text == OUTPUT and out.prompt + out.outputs[0].text == tok.decode(
        prompt + ids, skip_special_tokens=True
    )
    stopped = llm.generate(
        "Hello", SamplingParams(temperature=0.0, stop_token_ids=[ids[2]]), use_tqdm=False
    )
    assert stopped[0].outputs[0].text == " world "
    engine = llm.llm_engine
    delta = SamplingParams(temperature=0.0, max_tokens=30, output_kind=RequestOutputKind.DELTA)
    engine.add_request("r", {"prompt_token_ids": prompt}, delta)
    pieces = []
    while engine.has_unfinished_requests():
        pieces += [o.outputs[0].text for o in engine.step()]
    assert pieces[0] == " world" and "".join(pieces) == OUTPUT
    # max_tokens ends inside "😀": "€" stays, streamed and not
    capped = SamplingParams(temperature=0.0, max_tokens=7)
    assert llm.generate("Hello", capped, use_tqdm=False)[0].outputs[0].text == " world €"
    delta = SamplingParams(temperature=0.0, max_tokens=7, output_kind=RequestOutputKind.DELTA)
    engine.add_request("c", {"prompt_token_ids": prompt}, delta)
    pieces = []
    while engine.has_unfinished_requests():
        pieces += [o.outputs[0].text for o in engine.step()]
    assert "".join(pieces) == " world €"
