"""The engine's ``logprobs_mode`` (upstream's ``--logprobs-mode``): what sampled positions'
logprobs report. The default, raw_logprobs, is the model's own log_softmax, untouched by
logit_bias, penalties, min_tokens, temperature or filters; processed_logprobs is the
log_softmax of the logits a token is drawn from; the two "_logits" modes report the logits
themselves. Guards against logprobs taken from the biased and penalized logits by default,
and against the speculative scorer reporting other values than the sampler."""

import pytest
import torch

from vllm.model_executor.layers.sampler import Sampler
from vllm.model_executor.sampling_metadata import SamplingMetadata
from vllm.sampling_params import LOGPROBS_MODES, SamplingParams
from vllm.sequence import SequenceData, SequenceGroupMetadata
from vllm.spec_decode.batch_expansion import row_distributions

VOCAB = 50
PROMPT = [3, 4, 5]
OUTPUT = [7, 7, 9]  # seen tokens: repetition on 3, 4, 5, 7, 9; presence on 7, 9
INF = float("-inf")


def _metadata(params_list, mode):
    """One decode row per params (prompt PROMPT, output OUTPUT)."""
    mds = [
        SequenceGroupMetadata(str(i), False, {i: SequenceData(PROMPT, list(OUTPUT))}, p, {i: []})
        for i, p in enumerate(params_list)
    ]
    return SamplingMetadata.build(
        mds, [1] * len(mds), VOCAB, torch.device("cpu"), {}, logprobs_mode=mode
    )


def _edited(logits, p):
    """A row's logits after logit_bias and the penalties, written out by hand."""
    x = logits.clone().double()
    for t, b in (p.logit_bias or {}).items():
        x[int(t)] += b
    for t in set(PROMPT) | set(OUTPUT):
        r = p.repetition_penalty
        x[t] = x[t] / r if x[t] > 0 else x[t] * r
    for t in set(OUTPUT):
        x[t] -= p.presence_penalty + p.frequency_penalty * OUTPUT.count(t)
    return x


def _processed(logits, p):
    """The logits a row is drawn from: edited, then (unless greedy) tempered and top-k
    filtered (-inf outside the k largest)."""
    x = _edited(logits, p)
    if p.temperature == 0:
        return x
    x = x / p.temperature
    if p.top_k > 0:
        x[x < x.topk(p.top_k).values[-1]] = INF
    return x


def _reference(logits, p, mode):
    src = _processed(logits, p) if mode.startswith("processed") else logits.double()
    return torch.log_softmax(src, -1) if mode.endswith("_logprobs") else src


PARAMS = [
    # sampled, every edit: bias, penalties, temperature, top-k
    SamplingParams(temperature=0.6, top_k=5, repetition_penalty=1.6, presence_penalty=0.8,
                   logit_bias={2: 4.0, 11: -3.0}, logprobs=6, seed=1),
    # greedy with a filter of its own (not applied to its processed values) and penalties
    SamplingParams(temperature=0, top_k=2, repetition_penalty=2.0, frequency_penalty=0.3,
                   logit_bias={20: 2.5}, logprobs=4),
    # sampled, tempered only
    SamplingParams(temperature=1.7, logprobs=3, seed=2),
]  # fmt: skip


def _logits():
    torch.manual_seed(0)
    logits = torch.randn(len(PARAMS), VOCAB) * 2
    logits[:, 7] = 4.0  # a seen token the penalties push down
    return logits


@pytest.mark.parametrize("mode", LOGPROBS_MODES)
def test_sampler_reports_the_modes_values(mode):
    """Each row's sampled token and top-k carry the mode's values (ranks by value),
    whatever the other rows of the batch are."""
    logits = _logits()
    out = Sampler()(logits, _metadata(PARAMS, mode))
    for i, (p, g) in enumerate(zip(PARAMS, out.outputs)):
        s = g.samples[0]
        ref = _reference(logits[i], p, mode)
        top = ref.topk(p.logprobs)
        for t, v in zip(top.indices.tolist(), top.values.tolist()):
            assert s.logprobs[t].logprob == pytest.approx(v, abs=1e-5), (mode, i, t)
        tok = s.output_token
        assert s.logprobs[tok].logprob == pytest.approx(ref[tok].item(), abs=1e-5)
        assert s.logprobs[tok].rank == 1 + int((ref > ref[tok]).sum())
        # the token is the one drawn from the processed logits, in every mode
        assert _processed(logits[i], p)[tok] > INF
        if p.temperature == 0:
            assert tok == int(_edited(logits[i], p).argmax())
        # alone in its batch, a row samples the same token and reports the same values
        alone = Sampler()(logits[i : i + 1], _metadata([p], mode)).outputs[0].samples[0]
        assert alone.output_token == tok
        assert {t: lp.logprob for t, lp in alone.logprobs.items()} == pytest.approx(
            {t: lp.logprob for t, lp in s.logprobs.items()}
        )


def test_raw_and_processed_differ_on_these_rows():
    """The cases above are not vacuous: every edit moves the values."""
    logits = _logits()
    for i, p in enumerate(PARAMS):
        raw = _reference(logits[i], p, "raw_logprobs")
        proc = _reference(logits[i], p, "processed_logprobs")
        assert (raw - proc).abs().max() > 0.1, i


def test_tokens_do_not_depend_on_the_mode():
    """The mode changes what is reported, never which token is sampled (same seeds)."""
    logits = _logits()
    toks = {
        mode: [
            g.samples[0].output_token for g in Sampler()(logits, _metadata(PARAMS, mode)).outputs
        ]
        for mode in LOGPROBS_MODES
    }
    assert len({tuple(t) for t in toks.values()}) == 1, toks


def test_min_tokens_mask_is_processed_not_raw():
    """A stop token masked by min_tokens keeps its raw logprob and is -inf processed."""
    logits = torch.zeros(1, VOCAB)
    logits[0, 0] = 5.0  # EOS, the model's favourite
    p = SamplingParams(temperature=0, min_tokens=10, logprobs=2)
    p.all_stop_token_ids.add(0)
    raw = Sampler()(logits, _metadata([p], "raw_logprobs")).outputs[0].samples[0]
    proc = Sampler()(logits, _metadata([p], "processed_logprobs")).outputs[0].samples[0]
    assert raw.output_token == proc.output_token != 0
    assert raw.logprobs[0].rank == 1 and raw.logprobs[raw.output_token].rank == 2
    assert raw.logprobs[0].logprob == pytest.approx(torch.log_softmax(logits[0], -1)[0].item())
    assert proc.logprobs[proc.output_token].rank == 1 and 0 not in proc.logprobs


@pytest.mark.parametrize("mode", LOGPROBS_MODES)
def test_speculative_scorer_reports_the_samplers_values(mode):
    """The batch-expansion scorer's per-row values are the sampler's, in every mode."""
    logits = _logits()
    sm = _metadata(PARAMS, mode)
    _, _, values = row_distributions(logits, sm)
    out = Sampler()(logits, _metadata(PARAMS, mode))
    for i, g in enumerate(out.outputs):
        for t, lp in g.samples[0].logprobs.items():
            assert values[i, t].item() == pytest.approx(lp.logprob, abs=1e-6), (mode, i, t)
        assert torch.allclose(values[i].double(), _reference(logits[i], PARAMS[i], mode),
                              atol=1e-5)  # fmt: skip


def _hf_positions(hf, prompt, tokens):
    """transformers' logits at each generated position: [len(tokens), vocab] float64."""
    with torch.no_grad():
        out = hf(torch.tensor([prompt + tokens[:-1]])).logits[0].double()
    return out, out[len(prompt) - 1 :]


@pytest.mark.forked
@pytest.mark.parametrize("mode", [None, *LOGPROBS_MODES[1:]])
def test_engine_against_transformers(tiny_llama_dir, mode):
    """Through the engine, on the tiny Llama in float32, against transformers' logits on the
    same weights: a seeded sampled request with logit_bias, repetition and presence
    penalties, temperature and top-k reports the mode's values (the default, no mode given,
    is raw_logprobs); cumulative_logprob sums them; prompt logprobs are raw logprobs in
    every mode."""
    from tests.utils import load_hf_model
    from vllm import LLM

    kw = {} if mode is None else {"logprobs_mode": mode}
    mode = mode or "raw_logprobs"
    llm = LLM(tiny_llama_dir, device="cpu", dtype="float32", max_model_len=64, **kw)
    assert llm.llm_engine.model_config.logprobs_mode == mode
    hf, _ = load_hf_model(tiny_llama_dir)
    prompt = [1, 504, 2988, 314, 42, 216, 34, 32]
    p = SamplingParams(
        temperature=0.5, top_k=30, repetition_penalty=1.8, presence_penalty=1.5,
        logit_bias={42: 3.0, 216: 2.0}, seed=7, max_tokens=10, ignore_eos=True,
        logprobs=5, prompt_logprobs=3,
    )  # fmt: skip
    out = llm.generate({"prompt_token_ids": prompt}, p, use_tqdm=False)[0]
    c = out.outputs[0]
    toks = list(c.token_ids)
    assert len(set(toks)) >= 5, toks
    full, gen = _hf_positions(hf, prompt, toks)
    total = 0.0
    moved = 0.0
    for j, (tok, pos) in enumerate(zip(toks, c.logprobs)):
        seen = prompt + toks[:j]
        x = gen[j].clone()
        for t, b in p.logit_bias.items():
            x[t] += b
        for t in set(seen):
            x[t] = x[t] / 1.8 if x[t] > 0 else x[t] * 1.8
        for t in set(toks[:j]):
            x[t] -= 1.5
        x = x / 0.5
        x[x < x.topk(30).values[-1]] = INF
        src = x if mode.startswith("processed") else gen[j]
        ref = torch.log_softmax(src, -1) if mode.endswith("_logprobs") else src
        moved = max(moved, (torch.log_softmax(x, -1) - torch.log_softmax(gen[j], -1))
                    .abs()[ref > INF].max().item())  # fmt: skip
        assert ref[tok] > INF
        top = ref.topk(5)
        want = dict(zip(top.indices.tolist(), top.values.tolist())) | {tok: ref[tok].item()}
        assert pos.keys() == want.keys(), (j, pos.keys(), want.keys())
        for t, v in want.items():
            assert pos[t].logprob == pytest.approx(v, abs=1e-4), (mode, j, t)
        assert pos[tok].rank == 1 + int((ref > ref[tok]).sum())
        total += pos[tok].logprob
    assert moved > 0.5  # the edits change the distribution: raw and processed differ
    assert c.cumulative_logprob == pytest.approx(total, abs=1e-3)
    raw_prompt = torch.log_softmax(full[: len(prompt) - 1], -1)
    assert out.prompt_logprobs[0] is None
    for j, pos in enumerate(out.prompt_logprobs[1:]):
        target = prompt[j + 1]
        assert pos[target].logprob == pytest.approx(raw_prompt[j, target].item(), abs=1e-4)
        for t, lp in pos.items():
            assert lp.logprob == pytest.approx(raw_prompt[j, t].item(), abs=1e-4)
    llm.llm_engine.shutdown()
