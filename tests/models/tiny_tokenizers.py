"""Tokenizers built offline with the ``tokenizers`` library, and a checkpoint that forces
a chosen token stream, for detokenization tests beyond SmolLM2's byte-level BPE.

- :func:`byte_fallback_tokenizer`: Llama 2 / Mistral style SentencePiece BPE: words carry a
  leading "▁" (the decoder turns it into a space and strips the space at the start of a
  decode), characters outside the vocabulary become byte tokens ``<0x00>``..``<0xFF>``.
- :func:`save_token_chain_llama`: a 1-layer Llama whose greedy next token is a fixed
  function of the current token, so a prompt ending in token ``a`` generates the chain
  ``a -> chain[a] -> ...`` exactly, on CPU and through transformers alike.
"""

import json

import torch

_CORPUS = [
    "Hello world, this is a test of the tokenizer.",
    "The capital of France is Paris.",
    "naive cafe resume hello there world",
    "I am a small model and I like to say hello.",
    "stop here STOP now ### end of text",
    "one two three four five six seven eight nine ten",
] * 20
# What the byte-fallback chain checkpoint (conftest ``tiny_byte_fallback_chain_dir``)
# generates after "Hello": a word with its leading "▁", a lone "▁", characters spelled in
# byte tokens (3, 4, 3 and 3 bytes), then EOS.
CHAIN_TEXT = "Hello world €😀世界"
_ALPHABET = "▁abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.,#"


def byte_fallback_tokenizer():
    """A Llama-style fast tokenizer (vocab 3 specials + 256 byte tokens + about 225
    merged pieces; ``<s>`` = 1 is BOS and is added to encoded texts, ``</s>`` = 2 is EOS)
    trained on a small fixed corpus: deterministic, no download."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, trainers
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    metaspace = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trainer_tok = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tok.normalizer = metaspace
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=list(_ALPHABET),
        show_progress=False,
    )
    trainer_tok.train_from_iterator(_CORPUS, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        vocab.setdefault(piece, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True)
    )
    tok.normalizer = metaspace
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.add_special_tokens(
        [AddedToken(s, normalized=False, special=True) for s in ("<unk>", "<s>", "</s>")]
    )
    tok.post_processor = TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def chain_of(streams: list[list[int]]) -> dict[int, int]:
    """The next-token map that generates each of ``streams`` after its first token.

    Raises:
        ValueError: a token is followed by two different tokens.
    """
    chain: dict[int, int] = {}
    for ids in streams:
        for a, b in zip(ids, ids[1:]):
            if chain.setdefault(a, b) != b:
                raise ValueError(f"token {a} is followed by both {chain[a]} and {b}")
    return chain


def save_token_chain_llama(tokenizer, out_dir: str, chain: dict[int, int]) -> str:
    """Save a float32 Llama (1 layer, hidden 256) with ``tokenizer`` whose greedy next
    token after token ``a`` is ``chain[a]``.

    The attention and MLP output projections are zero, so the last hidden state is the
    current token's normalized random embedding; the LM head row of ``chain[a]`` is 10 x
    the unit vector of ``a``'s embedding, so ``chain[a]`` gets logit about 10 x 16 while
    random directions give about 10 x N(0, 1). Returns out_dir."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, hidden = len(tokenizer), 256
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        embed = torch.randn(vocab, hidden)
        model.model.embed_tokens.weight.copy_(embed)
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(vocab, hidden)
        for a, b in chain.items():
            head[b] += 10.0 * embed[a] / embed[a].norm()
        model.lm_head.weight.copy_(head)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    return out_dir
