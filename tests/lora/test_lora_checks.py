"""What the engine refuses before a LoRA request is queued, and how the scheduler keeps a
step within ``max_loras`` adapters (no engine started)."""

import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from vllm.lora.adapter import check_adapter, load_adapter, module_shapes
from vllm.lora.request import LoRARequest

LLAMA_MODULES = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj",
                 "gate_up_proj", "down_proj")  # fmt: skip


def _hf_config(tiny_llama_dir):
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(tiny_llama_dir)


def _copy(src, tmp_path, edit=None, name="a"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    if edit is not None:
        cfg = json.loads((dst / "adapter_config.json").read_text())
        edit(cfg)
        (dst / "adapter_config.json").write_text(json.dumps(cfg))
    return str(dst)


def test_peft_adapter_is_read_with_its_scale(tiny_llama_dir, lora_adapters):
    cfg = _hf_config(tiny_llama_dir)
    spec = check_adapter(lora_adapters["all"], cfg, LLAMA_MODULES, 16)
    assert (spec.rank, spec.scale) == (8, 2.0)  # lora_alpha / r
    assert spec.modules == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"}  # fmt: skip
    qv = check_adapter(lora_adapters["qv"], cfg, LLAMA_MODULES, 16)
    assert (qv.rank, qv.scale, qv.modules) == (4, 4.0, {"q_proj", "v_proj"})  # 8 / sqrt(4)
    tensors = load_adapter(qv)
    assert sorted(tensors) == [(i, m) for i in range(3) for m in ("q_proj", "v_proj")]
    a, b = tensors[(1, "v_proj")]
    hidden, kv = module_shapes(cfg)["v_proj"]
    assert tuple(a.shape) == (4, hidden) and tuple(b.shape) == (kv, 4)
    from safetensors.torch import load_file

    raw = load_file(os.path.join(lora_adapters["qv"], "adapter_model.safetensors"))
    key = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"
    assert b.tolist() == (raw[key] * 4.0).tolist()


@pytest.mark.parametrize(
    "edit,match",
    [
        (lambda c: c.update(use_dora=True), r"use_dora=true is not supported"),
        (lambda c: c.update(bias="all"), r"bias='all' is not supported"),
        (lambda c: c.update(lora_bias=True), r"lora_bias=true is not supported"),
        (lambda c: c.update(modules_to_save=["lm_head"]), r"modules_to_save=\['lm_head'\]"),
        (lambda c: c.update(rank_pattern={"q_proj": 2}), r"per-module rank_pattern"),
        (lambda c: c.update(r=0), r"r=0 must be a positive integer"),
        (lambda c: c.update(r=4), r"has shape \[8, \d+\], expected \[4, \d+\]"),
        (lambda c: c.update(peft_type="IA3"), r"peft_type='IA3', only LORA is served"),
    ],
    ids=["dora", "bias", "lora_bias", "modules_to_save", "rank_pattern", "r0", "r_mismatch", "ia3"],
)
def test_unsupported_adapters_are_refused(tiny_llama_dir, lora_adapters, tmp_path, edit, match):
    path = _copy(lora_adapters["all"], tmp_path, edit)
    with pytest.raises(ValueError, match=match):
        check_adapter(path, _hf_config(tiny_llama_dir), LLAMA_MODULES, 16)


def test_limits_and_model_mismatches_are_refused(tiny_llama_dir, lora_adapters, tmp_path):
    cfg = _hf_config(tiny_llama_dir)
    with pytest.raises(ValueError, match=r"rank r=8, above max_lora_rank=4"):
        check_adapter(lora_adapters["all"], cfg, LLAMA_MODULES, 4)
    with pytest.raises(ValueError, match=r"module 'down_proj' is not supported for LlamaConfig"):
        check_adapter(lora_adapters["all"], cfg, ("q_proj", "k_proj", "v_proj", "o_proj"), 16)
    wider = SimpleNamespace(**{**cfg.to_dict(), "hidden_size": 128})
    with pytest.raises(
        ValueError, match=r"down_proj.lora_B.weight. has shape \[64, 8\], expected \[128, 8\]"
    ):
        check_adapter(lora_adapters["all"], wider, LLAMA_MODULES, 16)
    fewer = SimpleNamespace(**{**cfg.to_dict(), "num_hidden_layers": 2})
    with pytest.raises(ValueError, match=r"is for layer 2; the model has 2"):
        check_adapter(lora_adapters["all"], fewer, LLAMA_MODULES, 16)
    with pytest.raises(ValueError, match=r"is not a directory"):
        check_adapter(str(tmp_path / "nowhere"), cfg, LLAMA_MODULES, 16)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"has no adapter_config.json"):
        check_adapter(str(empty), cfg, LLAMA_MODULES, 16)
    no_weights = _copy(lora_adapters["qv"], tmp_path, name="nw")
    os.remove(os.path.join(no_weights, "adapter_model.safetensors"))
    with pytest.raises(ValueError, match=r"has none of \['adapter_model.safetensors'"):
        check_adapter(no_weights, cfg, LLAMA_MODULES, 16)


def test_home_and_relative_adapter_paths(tiny_llama_dir, lora_adapters, tmp_path, monkeypatch):
    """``~/...`` and relative adapter paths are read as upstream reads them (the user's home;
    the current directory), and the spec holds the absolute path the workers read. Guards:
    ``--lora-modules sql=~/adapters/sql`` (no shell expands that ``~``) was refused as "not
    a directory"."""
    cfg = _hf_config(tiny_llama_dir)
    _copy(lora_adapters["qv"], tmp_path, name="qv")
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = check_adapter("~/qv", cfg, LLAMA_MODULES, 16)
    assert (spec.path, spec.rank) == (str(tmp_path / "qv"), 4)
    monkeypatch.chdir(tmp_path)
    assert check_adapter("qv", cfg, LLAMA_MODULES, 16).path == str(tmp_path / "qv")


def test_broken_weight_files_are_refused_before_queueing(tiny_llama_dir, lora_adapters, tmp_path):
    """A lora_A without its lora_B and a truncated weight file are refused by the engine's
    check with a ValueError naming the problem (the server's load_lora_adapter: a 400).
    Guards: the missing half was found only by the worker at the request's first step (the
    load answered 200 and every request with the adapter failed inside the engine), and a
    truncated file raised safetensors' own error (a 500 from load_lora_adapter)."""
    from safetensors.torch import load_file, save_file

    cfg = _hf_config(tiny_llama_dir)
    half = _copy(lora_adapters["qv"], tmp_path, name="half")
    file = os.path.join(half, "adapter_model.safetensors")
    state = load_file(file)
    del state["base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight"]
    save_file(state, file)
    with pytest.raises(ValueError, match=r"layer 1 v_proj has lora_A without its other half"):
        check_adapter(half, cfg, LLAMA_MODULES, 16)
    cut = _copy(lora_adapters["qv"], tmp_path, name="cut")
    os.truncate(os.path.join(cut, "adapter_model.safetensors"), 100)
    with pytest.raises(ValueError, match=r"cannot read adapter_model.safetensors: Safetensor"):
        check_adapter(cut, cfg, LLAMA_MODULES, 16)


@pytest.mark.parametrize(
    "change,match",
    [
        (lambda t: t * float("nan"), r"q_proj.lora_B.weight' holds NaN or infinite values"),
        (lambda t: t / 0.0, r"q_proj.lora_B.weight' holds NaN or infinite values"),
        (lambda t: (t * 100).to(torch.int8), r"has dtype torch.int8; LoRA weights must be float"),
    ],
    ids=["nan", "inf", "int8"],
)
def test_weights_that_would_poison_the_batch_are_refused(
    tiny_llama_dir, lora_adapters, tmp_path, change, match
):
    """A tensor with NaN or infinite values, or of an integer dtype, is refused by the
    engine's check; float16 / bfloat16 / float64 weights are served. Guards: such adapters
    were served, and since the batched LoRA product multiplies every slot's columns by a
    0/1 mask, a NaN slot turned the logits of every request of the step into NaN (base
    model and other adapters included) for as long as it stayed in its slot."""
    from safetensors.torch import load_file, save_file

    cfg = _hf_config(tiny_llama_dir)
    path = _copy(lora_adapters["qv"], tmp_path, name="bad")
    file = os.path.join(path, "adapter_model.safetensors")
    state = load_file(file)
    key = "base_model.model.model.layers.2.self_attn.q_proj.lora_B.weight"
    state[key] = change(state[key])
    save_file(state, file)
    with pytest.raises(ValueError, match=match):
        check_adapter(path, cfg, LLAMA_MODULES, 16)
    for dtype in (torch.float16, torch.bfloat16, torch.float64):
        ok = _copy(lora_adapters["qv"], tmp_path, name=str(dtype))
        file = os.path.join(ok, "adapter_model.safetensors")
        save_file({k: v.to(dtype) for k, v in load_file(file).items()}, file)
        assert check_adapter(ok, cfg, LLAMA_MODULES, 16).rank == 4


def test_lora_request_fields():
    r = LoRARequest("a", 3, "/x")
    assert (r.adapter_id, r.name, r.path, r.base_model_name) == (3, "a", "/x", None)
    for kw, match in [
        (dict(lora_name="", lora_int_id=1, lora_path="/x"), "lora_name must be a non-empty"),
        (dict(lora_name="a", lora_int_id=0, lora_path="/x"), "lora_int_id must be at least 1"),
        (dict(lora_name="a", lora_int_id=True, lora_path="/x"), "must be an integer"),
        (dict(lora_name="a", lora_int_id=1, lora_path=""), "must name its directory"),
    ]:
        with pytest.raises(ValueError, match=match):
            LoRARequest(**kw)


def test_lora_config_limits():
    from vllm.lora.config import LoRAConfig

    assert LoRAConfig(max_loras=3).max_cpu_loras == 3
    with pytest.raises(ValueError, match="max_lora_rank must be at least 1, got 0"):
        LoRAConfig(max_lora_rank=0)
    with pytest.raises(ValueError, match="max_cpu_loras=1 must be at least max_loras=2"):
        LoRAConfig(max_loras=2, max_cpu_loras=1)


def _group(rid, lora_id, tokens=4):
    from vllm.sampling_params import SamplingParams
    from vllm.sequence import Sequence, SequenceGroup

    lora = None if lora_id is None else LoRARequest(f"l{lora_id}", lora_id, "/x")
    seq = Sequence(int(rid), None, list(range(1, tokens + 1)), 4, None)
    return SequenceGroup(rid, [seq], SamplingParams(max_tokens=4), lora_request=lora)


@pytest.mark.parametrize("chunked", [False, True])
def test_scheduler_admits_at_most_max_loras_adapters(chunked):
    """Waiting requests whose adapter would be a third one wait (keeping their place) while
    requests of running adapters and of the base model are admitted past them."""
    from vllm.config import CacheConfig, SchedulerConfig
    from vllm.core.scheduler import Scheduler
    from vllm.lora.config import LoRAConfig
    from vllm.sequence import SequenceStatus

    cache = CacheConfig(block_size=4, num_gpu_blocks_override=64)
    cache.num_gpu_blocks = 64
    sc = SchedulerConfig(max_model_len=64, enable_chunked_prefill=chunked, max_num_seqs=16,
                         max_num_batched_tokens=64)  # fmt: skip
    sched = Scheduler(sc, cache, LoRAConfig(max_loras=2))
    for rid, lora in enumerate([1, 2, 3, None, 1, 3, 2]):
        sched.add_seq_group(_group(str(rid), lora))
    _, out = sched.schedule()
    assert [g.request_id for g in out.scheduled_seq_groups] == ["0", "1", "3", "4", "6"]
    assert [g.request_id for g in sched.waiting] == ["2", "5"]
    for g in list(sched.running):  # adapters 1 and 2 finish: adapter 3 gets in
        if g.lora_int_id in (1, 2):
            g.seqs[0].status = SequenceStatus.FINISHED_STOPPED
    sched.free_finished_seq_groups()
    _, out = sched.schedule()
    assert [g.request_id for g in out.scheduled_seq_groups if g.request_id in "25"] == ["2", "5"]
    # without LoRA limits everything is admitted at once
    free = Scheduler(sc, cache)
    for rid, lora in enumerate([1, 2, 3]):
        free.add_seq_group(_group(str(rid), lora))
    assert len(free.schedule()[1].scheduled_seq_groups) == 3


def test_parse_lora_modules():
    import argparse

    from vllm.entrypoints.openai.lora_modules import lora_requests, parse_lora_module

    assert parse_lora_module("sql=/a/b") == ("sql", "/a/b", None)
    assert parse_lora_module('{"name": "x", "path": "/p", "base_model_name": "m"}') == (
        "x", "/p", "m",
    )  # fmt: skip
    for bad in ["nopath", "=p", "n=", '{"name": "x"}', '{"name": "x", "path": "/p", "r": 1}',
                "{bad json"]:  # fmt: skip
        with pytest.raises(argparse.ArgumentTypeError):
            parse_lora_module(bad)
    reqs = lora_requests([("a", "/p", None), ("b", "/q", "m")], ["m"], True)
    assert [(r.lora_name, r.lora_int_id, r.lora_path) for r in reqs] == [
        ("a", 1, "/p"), ("b", 2, "/q"),
    ]  # fmt: skip
    with pytest.raises(ValueError, match="--lora-modules needs --enable-lora"):
        lora_requests([("a", "/p", None)], ["m"], False)
    with pytest.raises(ValueError, match="name 'm' is already a served model"):
        lora_requests([("m", "/p", None)], ["m"], True)


def test_lora_requests_info_metric():
    """Upstream's ``vllm:lora_requests_info``: one series naming the running and waiting
    adapters and max_lora, replaced when they change, valued at the time of the change."""
    import time

    from vllm.engine.metrics import EngineMetrics, StepStats

    def series(m):
        return [line for line in m.render().decode().splitlines()
                if line.startswith("vllm:lora_requests_info{")]  # fmt: skip

    m = EngineMetrics("base")
    m.configure(64, {"block_size": 16}, max_loras=2)
    t0 = time.time()
    m.record(StepStats(lora_running=("a", "b"), lora_waiting=("c",)))
    (line,) = series(m)
    assert 'running_lora_adapters="a,b"' in line and 'waiting_lora_adapters="c"' in line
    assert 'max_lora="2"' in line and float(line.rsplit(" ", 1)[1]) >= t0 - 1
    m.record(StepStats(lora_running=("c",), lora_waiting=()))
    (line,) = series(m)
    assert 'running_lora_adapters="c"' in line and 'waiting_lora_adapters=""' in line
    plain = EngineMetrics("base")
    plain.configure(64, {"block_size": 16})
    plain.record(StepStats())
    assert series(plain) == []


def test_step_stats_name_running_and_waiting_adapters():
    from vllm.engine.async_steps import EngineSteps
    from vllm.lora.config import LoRAConfig

    running = [_group("0", 2), _group("1", None), _group("2", 1), _group("3", 2)]
    waiting = [_group("4", 3)]
    sched = SimpleNamespace(running=running, waiting=waiting)
    engine = SimpleNamespace(config=SimpleNamespace(lora_config=LoRAConfig()), schedulers=[sched])
    names = EngineSteps._lora_names(SimpleNamespace(engine=engine))
    assert names == {"lora_running": ("l1", "l2"), "lora_waiting": ("l3",)}
    engine.config.lora_config = None
    assert EngineSteps._lora_names(SimpleNamespace(engine=engine)) == {}
