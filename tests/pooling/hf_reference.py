"""The references of the embedding tests, from transformers on the same weights: a
prompt's pooled final hidden states (``model.model(ids).last_hidden_state``, after the last
norm), the tokenizer's ids of a text, and the cosine similarity of two vectors."""

import numpy as np
import torch


def hf_embeddings(model_dir, prompts, pooling="LAST", normalize=True) -> list[torch.Tensor]:
    """transformers' pooled final hidden states [hidden] float32, one per prompt (token
    ids)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            h = model.model(torch.tensor([ids])).last_hidden_state[0]  # [len, hidden]
            vec = {"LAST": h[-1], "MEAN": h.mean(dim=0), "CLS": h[0]}[pooling]
            out.append(torch.nn.functional.normalize(vec, dim=0) if normalize else vec)
    return out


def hf_token_ids(model_dir, texts) -> list[list[int]]:
    """The checkpoint's tokenizer's ids of each text (``tokenizer.encode``)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [tokenizer.encode(t) for t in texts]


def cosine(a, b) -> float:
    """Cosine similarity of two vectors, in float64."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
