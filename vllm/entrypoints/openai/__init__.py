"""The OpenAI-compatible server (``vllm serve``): api_server, protocol, serving_*."""
