"""GPTQ and AWQ checkpoints loaded dequantized to the model's dtype
(vllm/model_executor/layers/int_checkpoint.py, int_dequant.py).

The checkpoints are written here from tiny models the way AutoGPTQ / GPTQModel and AutoAWQ
write theirs: each decoder projection quantized per group of input channels (asymmetric,
or symmetric with zero point 2 ** (bits - 1)), packed into int32 ``qweight`` / ``qzeros``
with float16 ``scales`` (GPTQ: along the input dimension, with ``g_idx``, zero points
stored minus one in the classic "gptq" format and as they are in "gptq_v2"; AWQ: along the
output dimension in AWQ's interleaved order), float16 biases and unquantized tensors, and
the ``quantization_config`` those tools write. A second directory holds exactly the values
they stand for, ``(q - zero) * scale``. In float32 on CPU the engine on the quantized
checkpoint gives exactly its outputs on the dequantized one, and transformers' on that
one (tokens; logprobs within 1e-4, the engine's and transformers' float32 sums differing).

The unpacking itself is checked against words packed by hand with Python integers
(:func:`test_unpack_hand_packed_words`, :func:`test_dequantize_hand_packed_layers`), so a
packer here and an unpacker there sharing one mistake (the zero offset, AWQ's order) cannot
pass unnoticed.
"""

import json
import random
import re
import shutil
from types import SimpleNamespace

import pytest
import torch

from tests.models.test_fp8 import PROMPTS
from tests.models.test_fp8_checkpoint import (
    MAX_TOKENS,
    _set_quantization_config,
    _with_config,
    reference,
    write_twins,
)
from tests.utils import (
    check_outputs_equal,
    check_top5_logprobs_within,
    stage_start_method,
    vllm_greedy,
)
from vllm.model_executor.layers.int_checkpoint import IntCheckpoint
from vllm.model_executor.layers.int_dequant import (
    dequantize_awq,
    dequantize_gptq,
    int_dequantized_weights,
    unpack_awq,
    unpack_int32,
)

# AutoAWQ's GEMM packer: value i of a word (bits 4i..4i+3) is output column AWQ_ORDER[i]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]
# decoder projections, dense or of one expert; not the MoE router (mlp.gate) nor lm_head
_PROJ = re.compile(
    r"\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down)_proj)\.weight$"
)


def _i32(word: int) -> int:
    """An unsigned 32-bit word as the signed int32 a checkpoint stores."""
    return word - (1 << 32) if word >= 1 << 31 else word


def _pack_words(values: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 words of ``values`` [..., 32 / bits]: value j at bits j * bits."""
    acc = torch.zeros(values.shape[:-1], dtype=torch.int64)
    for j in range(values.shape[-1]):
        acc |= values[..., j].to(torch.int64) << (bits * j)
    return torch.where(acc >= 1 << 31, acc - (1 << 32), acc).to(torch.int32)


def _pack_cols(values: torch.Tensor, bits: int, order=None) -> torch.Tensor:
    """[R, C] packed along the columns: [R, C / (32 / bits)] (AWQ: value i of a word is
    column ``order[i]`` of its group of 8)."""
    per = 32 // bits
    v = values.reshape(values.shape[0], -1, per)  # [R, C / per, per]
    if order is not None:
        v = v[..., order]
    return _pack_words(v, bits)


def _pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """[R, C] packed along the rows (GPTQ's qweight): [R / (32 / bits), C]."""
    per = 32 // bits
    v = values.reshape(-1, per, values.shape[1]).transpose(1, 2)  # [R / per, C, per]
    return _pack_words(v, bits)


def _quantize(w: torch.Tensor, g_idx: torch.Tensor, bits: int, sym: bool, zero_min: int):
    """Per-group quantization of ``w`` [out, in] as GPTQ's quantizer does it (the range
    widened to include 0; symmetric: zero 2 ** (bits - 1)): q [in, out], zeros and float16
    scales [groups, out], and the dequantized weight [out, in]."""
    maxq = 2**bits - 1
    wt = w.t().float()  # [in, out]
    groups = int(g_idx.max()) + 1
    zeros = torch.empty(groups, wt.shape[1])
    scales = torch.empty(groups, wt.shape[1], dtype=torch.float16)
    for g in range(groups):
        cols = wt[g_idx == g]  # [channels of g, out]
        lo, hi = cols.min(0).values.clamp(max=0), cols.max(0).values.clamp(min=0)
        if sym:
            hi = torch.maximum(-lo, hi)
            lo = -hi
        s = ((hi - lo) / maxq).clamp(min=1e-6).half()
        scales[g] = s
        zeros[g] = 2 ** (bits - 1) if sym else torch.round(-lo / s.float()).clamp(zero_min, maxq)
    s, z = scales.float()[g_idx], zeros[g_idx]  # [in, out]
    q = (torch.round(wt / s) + z).clamp(0, maxq)
    deq = ((q - z) * s).t().contiguous()
    return q.long(), zeros.long(), scales, deq


def _write(model_dir, q_dir, deq_dir, qc: dict, keep: str | None = None, seed: int = 0):
    """A GPTQ or AWQ checkpoint (``qc`` its quantization_config) of ``model_dir`` at
    ``q_dir``, the values it stands for at ``deq_dir``; projections matching ``keep`` (and
    ``lm_head`` unless ``qc["lm_head"]``) stay unquantized, in float16 like the rest."""
    gen = torch.Generator().manual_seed(seed)
    gptq, bits = qc["quant_method"] == "gptq", qc["bits"]

    def convert(key: str, w: torch.Tensor):
        half = w.half()
        quantized = _PROJ.search(key) or (key == "lm_head.weight" and qc.get("lm_head"))
        if not quantized or (keep and re.search(keep, key)):
            return {key: half}, half.float()
        n_in = w.shape[1]
        size = n_in if qc["group_size"] == -1 else qc["group_size"]
        g_idx = torch.arange(n_in) // size
        if qc.get("desc_act"):  # act-order: the channels' groups in a random order
            g_idx = g_idx[torch.randperm(n_in, generator=gen)]
        zero_min = 1 if gptq and qc["checkpoint_format"] == "gptq" else 0
        q, zeros, scales, deq = _quantize(w, g_idx, bits, qc.get("sym", False), zero_min)
        stem = key[: -len("weight")]
        if gptq:
            stored = zeros - (1 if qc["checkpoint_format"] == "gptq" else 0)
            out = {stem + "qweight": _pack_rows(q, bits), stem + "qzeros": _pack_cols(stored, bits),
                   stem + "g_idx": g_idx.to(torch.int32)}  # fmt: skip
        else:
            out = {stem + "qweight": _pack_cols(q, 4, AWQ_ORDER),
                   stem + "qzeros": _pack_cols(zeros, 4, AWQ_ORDER)}  # fmt: skip
        out[stem + "scales"] = scales
        return out, deq

    write_twins(model_dir, q_dir, deq_dir, convert)
    _set_quantization_config(q_dir, qc)


def _gptq(bits: int, group_size: int, fmt: str, desc_act: bool, sym: bool, **kw) -> dict:
    """A quantization_config as GPTQModel writes it."""
    return {"bits": bits, "group_size": group_size, "desc_act": desc_act, "sym": sym,
            "lm_head": False, "quant_method": "gptq", "checkpoint_format": fmt,
            "pack_dtype": "int32", "meta": {"quantizer": ["gptqmodel:2.2.0"]},
            "true_sequential": True, "damp_percent": 0.01, "static_groups": False,
            **kw}  # fmt: skip


def _awq(group_size: int, keep=None) -> dict:
    """A quantization_config as AutoAWQ writes it (``to_transformers_dict``)."""
    return {"quant_method": "awq", "zero_point": True, "group_size": group_size, "bits": 4,
            "version": "gemm", "modules_to_not_convert": keep}  # fmt: skip


CASES = {
    # classic format (zero points stored minus one), act-order: g_idx not monotone
    "llama-gptq-4bit-desc_act": ("tiny_llama_dir", _gptq(4, 32, "gptq", True, False), None),
    # GPTQModel's v2 zero points, 8 bits, one group per row, a quantized lm_head
    "llama-gptq_v2-8bit-lm_head": (
        "tiny_llama_dir", _gptq(8, -1, "gptq_v2", False, False, lm_head=True), None),
    # experts quantized, the router as stored; symmetric
    "qwen3_moe-gptq-4bit-sym": ("tiny_qwen3_moe_dir", _gptq(4, 32, "gptq", False, True), None),
    # q/k/v biases, one layer's MLP kept unquantized, TP = 2
    "qwen2-awq-tp2": ("tiny_qwen2_dir", _awq(32, ["layers.1.mlp"]), r"layers\.1\.mlp\."),
}  # fmt: skip


@pytest.mark.forked
@pytest.mark.parametrize("case", list(CASES))
def test_int_checkpoint_equals_transformers(case, request, tmp_path, monkeypatch):
    """Each checkpoint loads dequantized, no flag needed (float32 parameters, the config
    says how; at TP = 1 the engine's o_proj weight is the dequantized one exactly). The
    engine's outputs equal its outputs on the dequantized checkpoint (tokens and
    logprobs, at the same TP) and transformers' on it (tokens; logprobs within 1e-4)."""
    from safetensors.torch import load_file

    from vllm import LLM

    fixture, qc, keep = CASES[case]
    q_dir, deq_dir = str(tmp_path / "q"), str(tmp_path / "deq")
    _write(request.getfixturevalue(fixture), q_dir, deq_dir, qc, keep)
    ref = reference(deq_dir)
    tp = 2 if case.endswith("-tp2") else 1
    monkeypatch.setenv(
        "VLLM_WORKER_MULTIPROC_METHOD", stage_start_method()
    )  # torch ran in this process
    llm = LLM(model=q_dir, device="cpu", dtype="float32", tensor_parallel_size=tp)
    mc = llm.llm_engine.config.model_config
    assert mc.quantization is None and mc.checkpoint_int.method == qc["quant_method"]
    assert mc.checkpoint_int.zero_offset == int(qc.get("checkpoint_format") == "gptq")
    assert llm.apply_model(_param_dtypes) == [["torch.float32"]] * tp
    if tp == 1:
        (o_proj,) = llm.apply_model(_o_proj)
        expect = load_file(f"{deq_dir}/model.safetensors")["model.layers.0.self_attn.o_proj.weight"]
        assert torch.equal(o_proj, expect)
    out = vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5)
    llm.llm_engine.shutdown()
    del llm
    # the same values from a plain checkpoint: the same arithmetic, equal logprobs
    plain = LLM(model=deq_dir, device="cpu", dtype="float32", tensor_parallel_size=tp)
    expect = vllm_greedy(plain, PROMPTS, MAX_TOKENS, logprobs=5)
    plain.llm_engine.shutdown()
    check_outputs_equal(expect, out, "engine-dequantized", case, PROMPTS)
    assert [lp for _, _, lp in out] == [lp for _, _, lp in expect]
    check_outputs_equal(ref, out, "hf-dequantized", case, PROMPTS)
    # transformers sums in other orders than the engine's kernels (and TP's all-reduce):
    # float32 logprobs differ by up to ~1.4e-5 here, as on unquantized checkpoints
    check_top5_logprobs_within(ref, out, case, tol=1e-4)


def _param_dtypes(model) -> list[str]:
    """The dtypes of ``model``'s parameters (a function, so the mp executor can send it)."""
    return sorted({str(p.dtype) for p in model.parameters()})


def _o_proj(model) -> torch.Tensor:
    return model.model.layers[0].self_attn.o_proj.weight.clone()


@pytest.mark.forked
def test_quantization_fp8_requantizes_the_dequantized_weights(tiny_llama_dir, tmp_path):
    """``quantization="fp8"`` on a GPTQ checkpoint quantizes the dequantized projections
    per row: exactly what online fp8 gives on the dequantized checkpoint."""
    from vllm import LLM
    from vllm.model_executor.layers.fp8 import FP8_DTYPE

    q_dir, deq_dir = str(tmp_path / "q"), str(tmp_path / "deq")
    _write(tiny_llama_dir, q_dir, deq_dir, _gptq(4, 32, "gptq_v2", False, False))
    outs = []
    for model in (q_dir, deq_dir):
        llm = LLM(model=model, device="cpu", dtype="float32", quantization="fp8")
        assert llm.llm_engine.config.model_config.quantization == "fp8"
        (dtype,) = llm.apply_model(lambda m: m.model.layers[0].mlp.down_proj.weight.dtype)
        assert dtype == FP8_DTYPE
        outs.append(vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5))
        llm.llm_engine.shutdown()
        del llm
    check_outputs_equal(outs[1], outs[0], "online-fp8-of-dequantized", "gptq-requantized")
    for a, b in zip(outs[0], outs[1]):
        assert a[2] == b[2]  # the same arithmetic: logprobs equal


def test_unpack_hand_packed_words():
    """Words written out by hand: GPTQ's values run up a word from bit 0 (4 and 8 bits,
    the sign bit included), AWQ's word holds columns 0, 2, 4, 6, 1, 3, 5, 7 from bit 0."""
    qweight = torch.tensor([[_i32(0x76543210), _i32(0xFEDCBA98)]], dtype=torch.int32)
    assert unpack_int32(qweight, 4, dim=0).t().tolist() == [list(range(8)), list(range(8, 16))]
    assert unpack_int32(qweight, 4, dim=1).tolist() == [list(range(16))]
    eight = torch.tensor([[_i32(0x80FF017F)]], dtype=torch.int32)
    assert unpack_int32(eight, 8, dim=1).tolist() == [[0x7F, 0x01, 0xFF, 0x80]]
    # nibble i holds i; it belongs to column AWQ_ORDER[i]: columns 0..7 read 0 4 1 5 2 6 3 7
    assert unpack_awq(qweight[:, :1]).tolist() == [[0, 4, 1, 5, 2, 6, 3, 7]]
    assert unpack_awq(qweight[:, 1:]).tolist() == [[8, 12, 9, 13, 10, 14, 11, 15]]


def _py_word(values, bits):
    return _i32(sum(v << (bits * j) for j, v in enumerate(values)))


def test_dequantize_hand_packed_layers():
    """Small GPTQ (both zero formats, a non-monotone g_idx) and AWQ layers packed with
    Python integers; the expected weights computed the same way: exact. Reading a classic
    "gptq" layer as "gptq_v2" (no zero offset) is off by a scale everywhere."""
    rng = random.Random(0)
    n_in, n_out, groups = 16, 8, 2
    g_idx = [1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 0, 1, 1, 0, 1, 0]  # act-order: not monotone
    q = [[rng.randrange(16) for _ in range(n_out)] for _ in range(n_in)]  # [in][out]
    z = [[rng.randrange(1, 16) for _ in range(n_out)] for _ in range(groups)]
    s = [[rng.choice([0.25, 0.5, 1.0, 2.0]) for _ in range(n_out)] for _ in range(groups)]
    expect = [[(q[i][o] - z[g_idx[i]][o]) * s[g_idx[i]][o] for i in range(n_in)]
              for o in range(n_out)]  # fmt: skip
    qweight = [[_py_word([q[8 * r + j][o] for j in range(8)], 4) for o in range(n_out)]
               for r in range(n_in // 8)]  # fmt: skip
    scales = torch.tensor(s, dtype=torch.float16)
    for fmt, offset in (("gptq", 1), ("gptq_v2", 0)):
        qzeros = [[_py_word([zv - offset for zv in z[g]], 4)] for g in range(groups)]
        parts = {"qweight": torch.tensor(qweight, dtype=torch.int32),
                 "qzeros": torch.tensor(qzeros, dtype=torch.int32), "scales": scales,
                 "g_idx": torch.tensor(g_idx, dtype=torch.int32)}  # fmt: skip
        ckpt = IntCheckpoint("gptq", 4, 8, fmt, zero_offset=offset, desc_act=True)
        assert dequantize_gptq(parts, ckpt, torch.float32, "x").tolist() == expect
        if fmt == "gptq":
            v2 = IntCheckpoint("gptq", 4, 8, "gptq_v2", desc_act=True)
            wrong = dequantize_gptq(parts, v2, torch.float32, "x")
            assert wrong.tolist() != expect
    # AWQ: 8 input channels, 16 output columns (two words a row), groups of 4
    n_in, n_out, size = 8, 16, 4
    q = [[rng.randrange(16) for _ in range(n_out)] for _ in range(n_in)]
    z = [[rng.randrange(16) for _ in range(n_out)] for _ in range(n_in // size)]
    s = [[rng.choice([0.25, 0.5, 1.0, 2.0]) for _ in range(n_out)] for _ in range(n_in // size)]

    def awq_row(row):
        return [_py_word([row[8 * c + AWQ_ORDER[k]] for k in range(8)], 4) for c in range(2)]

    parts = {"qweight": torch.tensor([awq_row(r) for r in q], dtype=torch.int32),
             "qzeros": torch.tensor([awq_row(r) for r in z], dtype=torch.int32),
             "scales": torch.tensor(s, dtype=torch.float16)}  # fmt: skip
    expect = [[(q[i][o] - z[i // size][o]) * s[i // size][o] for i in range(n_in)]
              for o in range(n_out)]  # fmt: skip
    ckpt = IntCheckpoint("awq", 4, size, "gemm")
    assert dequantize_awq(parts, ckpt, torch.float32, "x").tolist() == expect
    assert dequantize_awq(parts, ckpt, torch.bfloat16, "x").dtype == torch.bfloat16


def test_pairing_and_load_errors():
    """A layer's tensors pair in any order with others between; a GPTQ layer without
    g_idx gets ``i // group_size`` groups (refused with desc_act); missing tensors and
    scales of the wrong shape name the layer."""
    torch.manual_seed(0)
    w = torch.randn(16, 64)
    g_idx = torch.arange(64) // 32
    q, zeros, scales, deq = _quantize(w, g_idx, 4, sym=False, zero_min=0)
    parts = {"a.qweight": _pack_rows(q, 4), "a.qzeros": _pack_cols(zeros, 4),
             "a.scales": scales, "a.g_idx": g_idx.to(torch.int32)}  # fmt: skip
    ckpt = IntCheckpoint("gptq", 4, 32, "gptq_v2")
    items = [("a.scales", parts["a.scales"]), ("a.bias", torch.ones(16)),
             ("a.qzeros", parts["a.qzeros"]), ("a.g_idx", parts["a.g_idx"]),
             ("norm.weight", torch.ones(4)), ("a.qweight", parts["a.qweight"])]  # fmt: skip
    out = dict(int_dequantized_weights(items, ckpt, torch.float32))
    assert list(out) == ["a.bias", "norm.weight", "a.weight"]
    assert torch.equal(out["a.weight"], deq)
    no_g_idx = [item for item in items if item[0] != "a.g_idx"]
    assert torch.equal(
        dict(int_dequantized_weights(no_g_idx, ckpt, torch.float32))["a.weight"], deq
    )
    act = IntCheckpoint("gptq", 4, 32, "gptq_v2", desc_act=True)
    with pytest.raises(ValueError, match=r"desc_act: g_idx is needed.*\{'a': \['g_idx'\]\}"):
        list(int_dequantized_weights(no_g_idx, act, torch.float32))
    with pytest.raises(ValueError, match=r"\{'a': \['qzeros', 'scales'\]\}"):
        list(int_dequantized_weights(items[3:], ckpt, torch.float32))
    bad = dict(parts, **{"a.scales": scales[:, :8]})
    with pytest.raises(ValueError, match=r"scales of quantized layer 'a' has shape \(2, 8\)"):
        list(int_dequantized_weights(bad.items(), ckpt, torch.float32))
    awq = {"qweight": _pack_cols(q, 4, AWQ_ORDER), "qzeros": _pack_cols(zeros, 4, AWQ_ORDER),
           "scales": scales}  # fmt: skip
    with pytest.raises(ValueError, match=r"'b' has shape \(2, 16\), expected \(4, 16\)"):
        dequantize_awq(awq, IntCheckpoint("awq", 4, 16, "gemm"), torch.float32, "b")


def test_configs_and_refusals(tiny_llama_dir, tmp_path):
    """Which configs load, what --quantization may say, and the refusals, each naming the
    value."""
    from vllm.engine.arg_utils import EngineArgs

    def build(model, **kw):
        return EngineArgs(model=model, device="cpu", **kw).create_engine_config().model_config

    def at(name, qc):
        return _with_config(tiny_llama_dir, tmp_path / name, qc)

    gptq = at("gptq", _gptq(4, 128, "gptq", True, False))
    mc = build(gptq)
    assert (mc.quantization, mc.checkpoint_fp8) == (None, None)
    assert mc.checkpoint_int == IntCheckpoint("gptq", 4, 128, "gptq", 1, True)
    assert build(gptq, quantization="gptq").checkpoint_int is not None
    assert build(gptq, quantization="fp8").quantization == "fp8"
    assert build(gptq, load_format="dummy").checkpoint_int is None  # the model's dtype
    with pytest.raises(ValueError, match="quantization='awq' does not match .*'gptq'"):
        build(gptq, quantization="awq")
    with pytest.raises(ValueError, match="quantization='gptq' names a pre-quantized format"):
        build(tiny_llama_dir, quantization="gptq")
    newer = {k: v for k, v in _gptq(8, 32, "x", False, True).items() if k != "checkpoint_format"}
    newer["format"] = "gptq_v2"  # GPTQModel's newer key
    assert build(at("newer", newer)).checkpoint_int == IntCheckpoint("gptq", 8, 32, "gptq_v2")
    awq = {k: v for k, v in _awq(64).items() if k != "version"}  # transformers' default
    assert build(at("awq", awq)).checkpoint_int == IntCheckpoint("awq", 4, 64, "gemm")
    # the tools' own files beside the weights, when config.json has no quantization_config
    for name, qc, expect in (
        ("quantize_config.json", {"bits": 4, "group_size": 128, "desc_act": False, "sym": True},
         IntCheckpoint("gptq", 4, 128, "gptq", 1)),
        ("quant_config.json", {"zero_point": True, "q_group_size": 64, "w_bit": 4,
                               "version": "GEMM", "modules_to_not_convert": None},
         IntCheckpoint("awq", 4, 64, "gemm")),
    ):  # fmt: skip
        target = tmp_path / name
        shutil.copytree(tiny_llama_dir, target)
        (target / name).write_text(json.dumps(qc))
        assert build(str(target)).checkpoint_int == expect
    (target / name).write_text(json.dumps({"w_bit": 3}))
    with pytest.raises(ValueError, match=r"'awq' in its quant_config.json\): bits=3"):
        build(str(target))
    refused = {
        "bits3": (_gptq(3, 128, "gptq", False, False),
                  r"'gptq'.*bits=3 \(GPTQ loads with 4 or 8\)"),
        "gemv": (dict(_awq(128), version="gemv"), r"'awq'.*version='gemv'"),
        "dynamic": (_gptq(4, 128, "gptq", False, False, dynamic={"+:.*down_proj": {"bits": 8}}),
                    re.escape("'dynamic' per-module overrides ['+:.*down_proj']")),
        "marlin": (_gptq(4, 128, "marlin", False, False), "checkpoint_format='marlin'"),
        "int64": (_gptq(4, 128, "gptq", False, False, pack_dtype="int64"), "pack_dtype='int64'"),
        "awq8": (dict(_awq(128), bits=8), r"'awq'.*bits=8 \(AWQ loads with 4\)"),
        "nozero": (dict(_awq(128), zero_point=False), "zero_point=False"),
    }  # fmt: skip
    for name, (qc, match) in refused.items():
        with pytest.raises(ValueError, match=match):
            build(at(name, qc))
    # dummy weights: nothing to refuse, the model's dtype
    assert build(at("bits3-dummy", refused["bits3"][0]), load_format="dummy").quantization is None


def test_startup_summary_names_the_dequantized_checkpoint():
    """The start-up summary line says a GPTQ / AWQ checkpoint was dequantized and needs
    the unquantized model's memory."""
    from vllm.worker.startup_summary import _quantization

    ckpt = IntCheckpoint("gptq", 4, 128, "gptq", 1, True)
    mc = SimpleNamespace(quantization=None, checkpoint_quantization=None,
                         checkpoint_dequantized=None, checkpoint_int=ckpt)  # fmt: skip
    config = SimpleNamespace(model_config=mc)
    text = ("gptq checkpoint dequantized: 4-bit, groups of 128, desc_act, format gptq; "
            "the unquantized model's memory, no integer kernels")  # fmt: skip
    assert _quantization(config) == f", quantization=none ({text})"
    mc.quantization = "fp8"
    assert _quantization(config) == (
        f", quantization=fp8 (decoder projections; on load, of the {text})"
    )
