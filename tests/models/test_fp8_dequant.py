"""fp8 checkpoints loaded dequantized to the model's dtype
(vllm/model_executor/layers/fp8_dequant.py): block-wise scales and mixture-of-experts models.

The checkpoints are written here from tiny models the way their producers write them:
e4m3 projection weights (the MoE router and lm_head kept as they are) with a scale per
tile (``weight_scale_inv`` for ``quant_method: "fp8"``, ``weight_scale`` for
compressed-tensors' ``strategy: "block"``) or per row, and the values they stand for
dequantized tile by tile with a loop (not the engine's expansion) into a second
directory. In float32 on CPU the engine on the fp8 checkpoint equals transformers on the
dequantized one (tokens; logprobs within 1e-4).
"""

import re
from types import SimpleNamespace

import pytest
import torch

from tests.models.test_fp8 import PROMPTS
from tests.models.test_fp8_checkpoint import (
    MAX_TOKENS,
    _set_quantization_config,
    check_against,
    reference,
    write_twins,
)
from tests.utils import check_outputs_equal, vllm_greedy
from vllm.model_executor.layers.fp8 import FP8_DTYPE
from vllm.model_executor.layers.fp8_dequant import dequantize_fp8, dequantized_weights

# a tile that leaves partial tiles in every tiny shape (64 = 16 x 4, 64 = 24 x 2 + 16, ...)
BLOCK = (16, 24)
# projections, dense or of one expert; not the router (mlp.gate) nor lm_head
_PROJ = re.compile(
    r"\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(experts\.\d+\.)?(gate|up|down|w1|w2|w3)"
    r"(_proj)?)\.weight$"
)


def _quantize_tiles(w: torch.Tensor, block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e4m3 weight, scales [tiles_n, tiles_k], the dequantized weight), tile by tile."""
    bn, bk = block
    n, k = w.shape
    tn, tk = -(-n // bn), -(-k // bk)
    q = torch.empty(n, k, dtype=FP8_DTYPE)
    scales = torch.empty(tn, tk)
    deq = torch.empty(n, k)
    for i in range(tn):
        for j in range(tk):
            tile = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk]
            s = tile.abs().amax().clamp(min=1e-12) / 448.0
            qt = (tile / s).to(FP8_DTYPE)
            q[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = qt
            deq[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = qt.float() * s
            scales[i, j] = s
    return q, scales, deq


def _write(model_dir: str, fp8_dir: str, deq_dir: str, qc: dict, scale_key: str, block) -> None:
    """An fp8 checkpoint of ``model_dir`` at ``fp8_dir`` (scales per ``block`` tile, or
    per row for None, stored as ``<x>.<scale_key>``) and its values at ``deq_dir``."""

    def convert(key: str, w: torch.Tensor) -> tuple[dict, torch.Tensor]:
        if not _PROJ.search(key):
            return {key: w}, w
        q, scales, deq = _quantize_tiles(w, block or (1, w.shape[1]))
        return {key: q, key[: -len("weight")] + scale_key: scales}, deq

    write_twins(model_dir, fp8_dir, deq_dir, convert)
    _set_quantization_config(fp8_dir, qc)


def _compressed_tensors(strategy: str) -> dict:
    weights = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
               "strategy": strategy}  # fmt: skip
    if strategy == "block":
        weights["block_structure"] = list(BLOCK)
    acts = {"num_bits": 8, "type": "float", "dynamic": True, "strategy": "token"}
    group = {"targets": ["Linear"], "weights": weights, "input_activations": acts}
    ignore = ["lm_head", "re:.*mlp.gate$"]  # the MoE router stays as it is
    return {"quant_method": "compressed-tensors", "format": "float-quantized",
            "config_groups": {"group_0": group}, "ignore": ignore}  # fmt: skip


CASES = {
    # Qwen3 / DeepSeek "-FP8": Hugging Face's fine-grained fp8 format
    "llama-fp8-block": ("tiny_llama_dir", "block-wise scales"),
    "qwen3_moe-compressed-tensors-block": ("tiny_qwen3_moe_dir", "block-wise scales"),
    "mixtral-compressed-tensors-channel": ("tiny_mixtral_dir", "mixture of experts"),
}


@pytest.mark.forked
@pytest.mark.parametrize("case", list(CASES))
def test_dequantized_checkpoint_equals_transformers(case, request, tmp_path):
    """A dense model with ``weight_block_size`` scales and two MoE models (block-wise, and
    per row, which fp8 layers would take but for the experts) load dequantized: float32
    parameters, the start-up summary says so, and the engine equals transformers on the
    dequantized values."""
    from vllm import LLM

    fixture, why = CASES[case]
    model_dir = request.getfixturevalue(fixture)
    if case.endswith("fp8-block"):
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
              "weight_block_size": list(BLOCK)}  # fmt: skip
        scale_key, block = "weight_scale_inv", BLOCK
    else:
        strategy = case.rsplit("-", 1)[1]
        qc = _compressed_tensors(strategy)
        scale_key, block = "weight_scale", BLOCK if strategy == "block" else None
    fp8_dir, deq_dir = str(tmp_path / "fp8"), str(tmp_path / "deq")
    _write(model_dir, fp8_dir, deq_dir, qc, scale_key, block)
    ref = reference(deq_dir)
    llm = LLM(model=fp8_dir, device="cpu", dtype="float32")
    mc = llm.llm_engine.config.model_config
    assert (mc.quantization, mc.checkpoint_quantization) == (None, None)
    assert mc.checkpoint_dequantized == f"{qc['quant_method']}, {why}"
    dtypes = llm.apply_model(lambda m: sorted({str(p.dtype) for p in m.parameters()}))[0]
    assert dtypes == ["torch.float32"]
    check_against(llm, ref, case)


@pytest.mark.forked
def test_quantization_fp8_requantizes_the_dequantized_weights(tiny_llama_dir, tmp_path):
    """``quantization="fp8"`` on a block-wise checkpoint quantizes the dequantized
    projections per row: exactly what online fp8 gives on the dequantized checkpoint."""
    from vllm import LLM

    qc = {"quant_method": "fp8", "weight_block_size": list(BLOCK)}
    fp8_dir, deq_dir = str(tmp_path / "fp8"), str(tmp_path / "deq")
    _write(tiny_llama_dir, fp8_dir, deq_dir, qc, "weight_scale_inv", BLOCK)
    outs = []
    for model in (fp8_dir, deq_dir):
        llm = LLM(model=model, device="cpu", dtype="float32", quantization="fp8")
        mc = llm.llm_engine.config.model_config
        assert mc.quantization == "fp8" and mc.checkpoint_quantization is None
        assert llm.apply_model(lambda m: m.model.layers[0].mlp.down_proj.weight.dtype)[0] == (
            FP8_DTYPE
        )
        outs.append(vllm_greedy(llm, PROMPTS, MAX_TOKENS, logprobs=5))
        llm.llm_engine.shutdown()
        del llm
    check_outputs_equal(outs[1], outs[0], "online-fp8-of-dequantized", "fp8-block-requantized")
    for a, b in zip(outs[0], outs[1]):
        assert a[2] == b[2]  # the same arithmetic: logprobs equal


def test_dequantize_layouts_and_pairing():
    """Per tensor, per row ([N] and [N, 1]) and per partial tile, against a loop; a scale of
    another shape names the tensor; weights and scales pair in any order, and one left
    without its pair is named."""
    torch.manual_seed(0)
    w = torch.randn(40, 50)
    q, scales, deq = _quantize_tiles(w, BLOCK)  # 3 x 3 tiles, the last ones partial
    assert torch.equal(dequantize_fp8(q, scales, BLOCK, torch.float32), deq)
    rows = torch.rand(40) + 0.5
    expect = q.float() * rows[:, None]
    assert torch.equal(dequantize_fp8(q, rows, None, torch.float32), expect)
    assert torch.equal(dequantize_fp8(q, rows[:, None], BLOCK, torch.float32), expect)
    assert torch.equal(dequantize_fp8(q, torch.tensor([2.0]), None, torch.float32), q.float() * 2)
    assert dequantize_fp8(q, scales, BLOCK, torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match=r"'x.weight' \(40, 50\) has shape \(2, 3\).*16x24 tile"):
        dequantize_fp8(q, scales[:2], BLOCK, torch.float32, "x.weight")
    items = [("a.weight_scale_inv", scales), ("b.bias", torch.ones(2)), ("a.weight", q),
             ("c.input_scale", torch.ones(1)), ("d.weight", q)]  # fmt: skip
    with pytest.raises(ValueError, match=r"without a weight_scale .*\['d.weight'\]"):
        list(dequantized_weights(items, BLOCK, torch.float32, (".input_scale",)))
    out = dict(dequantized_weights(items[:4], BLOCK, torch.float32, (".input_scale",)))
    assert list(out) == ["b.bias", "a.weight"] and torch.equal(out["a.weight"], deq)


def test_block_configs(tiny_llama_dir, tiny_mixtral_dir, tmp_path):
    """Which configs load dequantized, which as fp8 layers, and the refusals."""
    from tests.models.test_fp8_checkpoint import _with_config
    from vllm.engine.arg_utils import EngineArgs

    def build(model, **kw):
        return EngineArgs(model=model, device="cpu", **kw).create_engine_config().model_config

    block = _with_config(tiny_llama_dir, tmp_path / "block", {"quant_method": "fp8",
                         "weight_block_size": [128, 128]})  # fmt: skip
    mc = build(block)
    assert (mc.quantization, mc.checkpoint_dequantized) == (None, "fp8, block-wise scales")
    assert build(block, quantization="fp8").quantization == "fp8"
    with pytest.raises(ValueError, match="'fbgemm_fp8' does not match .*'fp8'"):
        build(block, quantization="fbgemm_fp8")
    mc = build(block, load_format="dummy")  # random weights in the model's dtype
    assert (mc.quantization, mc.checkpoint_dequantized) == (None, None)
    bad = {"quant_method": "fp8", "weight_block_size": [128, 0]}
    with pytest.raises(ValueError, match=r"a block size of \[128, 0\]"):
        build(_with_config(tiny_llama_dir, tmp_path / "bad", bad))
    moe = build(_with_config(tiny_mixtral_dir, tmp_path / "moe", {"quant_method": "fbgemm_fp8"}))
    assert (moe.quantization, moe.checkpoint_dequantized) == (
        None,
        "fbgemm_fp8, mixture of experts",
    )
    auto = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ["lm_head"]}
    mc = build(_with_config(tiny_llama_dir, tmp_path / "auto", auto))
    assert (mc.quantization, mc.checkpoint_quantization) == ("fp8", "fp8")


def test_load_errors_name_the_tensor(tiny_llama_dir):
    """A scale of the wrong shape, an e5m2 weight for an fp8 layer and a scale whose
    weight is stored unquantized: each message names the checkpoint tensor (and the
    stored dtype)."""
    from tests.models.test_weight_loading import model_config
    from tests.models.tiny_models import load_hf_config
    from vllm.model_executor.layers.fp8_checkpoint import prepare_fp8_params
    from vllm.model_executor.model_loader import get_model

    model = get_model(model_config(tiny_llama_dir, load_hf_config(tiny_llama_dir)), "cpu")
    prepare_fp8_params(model)
    k = "model.layers.1.self_attn.k_proj"
    with pytest.raises(ValueError, match=rf"'{k}.weight_scale': shard 'k'.*\(10,\)"):
        model.load_weights([(f"{k}.weight_scale", torch.ones(10))])
    e5m2 = torch.zeros(32, 64).to(torch.float8_e5m2)
    with pytest.raises(ValueError, match="float8_e5m2, expected float8_e4m3fn.*e4m3 weights only"):
        model.load_weights([(f"{k}.weight", e5m2)])
    items = [("a.weight_scale_inv", torch.ones(1, 1)), ("a.weight", torch.zeros(4, 4))]
    with pytest.raises(ValueError, match=r"not fp8: \{'a.weight': 'torch.float32'\}"):
        list(dequantized_weights(items, BLOCK, torch.float32))


def test_block_scale_grid_of_the_wrong_size_is_refused():
    """With block-wise scales a 2-D scale is a grid of tiles: [1, 1] for a weight of 3 x 2
    tiles is refused (naming the grid expected), not read as one scale per tensor; it is
    the grid of a one-tile weight, and a 0-D / [1] scale still means one per tensor."""
    q = torch.ones(40, 50).to(FP8_DTYPE)  # 3 x 3 tiles of 16 x 24
    one = torch.full((1, 1), 0.5)
    with pytest.raises(ValueError, match=r"has shape \(1, 1\).*16x24 tile \(3, 3\)"):
        dequantize_fp8(q, one, BLOCK, torch.float32, "x.weight")
    tile = q[:16, :24]
    assert torch.equal(dequantize_fp8(tile, one, BLOCK, torch.float32), tile.float() * 0.5)
    for scale in (torch.tensor(0.5), torch.tensor([0.5])):
        assert torch.equal(dequantize_fp8(q, scale, BLOCK, torch.float32), q.float() * 0.5)


def test_quantized_lm_head_among_fp8_layers_is_refused():
    """fp8's and fbgemm_fp8's configs do not say whether lm_head is quantized: an fp8
    ``lm_head.weight`` or an lm_head scale in the checkpoint is refused as compressed-tensors'
    is (not an "unexpected checkpoint weight"); the unused tensors are dropped."""
    from vllm.model_executor.layers.fp8_checkpoint import fp8_layer_tensors

    cfg = SimpleNamespace(quantization_config={"quant_method": "fbgemm_fp8"})
    dense = torch.zeros(4, 4)
    items = [("lm_head.weight", dense), ("a.input_scale", torch.ones(1)), ("b.weight", dense)]
    assert [n for n, _ in fp8_layer_tensors(items, "m", cfg)] == ["lm_head.weight", "b.weight"]
    for name, t in (("lm_head.weight", dense.to(FP8_DTYPE)), ("lm_head.weight_scale", dense)):
        with pytest.raises(ValueError, match=rf"'fbgemm_fp8'.*quantized lm_head .*'{name}'"):
            list(fp8_layer_tensors([(name, t)], "m", cfg))


def test_block_structure_string(tiny_llama_dir, tmp_path):
    """Older compressed-tensors releases write ``block_structure`` as "NxM": read as
    [N, M]; another string is refused, named whole."""
    from tests.models.test_fp8_checkpoint import _with_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.layers.fp8_checkpoint import checkpoint_fp8_method

    qc = _compressed_tensors("block")
    qc["config_groups"]["group_0"]["weights"]["block_structure"] = "64x128"
    model = _with_config(tiny_llama_dir, tmp_path / "str", qc)
    mc = EngineArgs(model=model, device="cpu").create_engine_config().model_config
    assert mc.checkpoint_dequantized == "compressed-tensors, block-wise scales"
    assert mc.checkpoint_fp8.block == (64, 128)
    qc["config_groups"]["group_0"]["weights"]["block_structure"] = "64 by 128"
    with pytest.raises(ValueError, match=r"a block size of \['64 by 128'\]"):
        checkpoint_fp8_method(model, SimpleNamespace(quantization_config=qc), moe=False)
