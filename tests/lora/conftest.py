"""PEFT adapters of the tiny Llama checkpoint, made by PEFT itself (``get_peft_model`` and
``save_pretrained``), and PEFT's own greedy outputs as the reference."""

import pytest
import torch

from tests.conftest import _built

# name -> (r, lora_alpha, use_rslora, target modules, seed)
ADAPTERS = {
    "all": (
        8,
        16,
        False,
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        1,
    ),  # fmt: skip
    "qv": (4, 8, True, ["q_proj", "v_proj"], 2),
}


def _save_adapter(base_dir: str, out: str, r: int, alpha: int, rslora: bool, targets, seed: int):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    # init_lora_weights=False: B random as well as A, so the adapter changes the outputs
    cfg = LoraConfig(r=r, lora_alpha=alpha, use_rslora=rslora, target_modules=targets,
                     init_lora_weights=False)  # fmt: skip
    get_peft_model(base, cfg).save_pretrained(out)
    return out


@pytest.fixture(scope="session")
def lora_adapters(tiny_llama_dir, tiny_models_dir) -> dict[str, str]:
    """Adapter name -> directory, for every entry of :data:`ADAPTERS` (built once)."""
    return {
        name: _built(
            tiny_models_dir / f"lora_{name}",
            lambda p, spec=spec: _save_adapter(tiny_llama_dir, p, *spec),
        )
        for name, spec in ADAPTERS.items()
    }


def peft_greedy(base_dir: str, adapter_dir: str | None, prompt: list[int], n: int):
    """PEFT's greedy continuation of ``prompt`` (``n`` ids) and each chosen id's logprob
    (float32 CPU; the base model alone when ``adapter_dir`` is None)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    model.eval()
    ids = list(prompt)
    lps = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1]  # [vocab]
            logprobs = torch.log_softmax(logits.float(), dim=-1)
            nxt = int(torch.argmax(logprobs))
            ids.append(nxt)
            lps.append(float(logprobs[nxt]))
    return ids[len(prompt) :], lps


def adapter_path(adapters: dict[str, str], name: str | None) -> str | None:
    return None if name is None else adapters[name]
