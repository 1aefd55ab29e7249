"""Pooling (embedding) models: a generative checkpoint served with ``--task embed``.

- :mod:`vllm.pooling.config`: :class:`PoolerConfig` (pooling type, normalization) and
  which task and runner flags ask for it.
- :mod:`vllm.pooling.st_config`: the pooler a Sentence Transformers checkpoint declares.
- :mod:`vllm.pooling.pooler`: one vector per prompt from the last stage's hidden states.
"""
