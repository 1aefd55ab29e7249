"""The OpenAI-compatible server (``vllm serve``): api_server (the launch), server_args (the
flags' checks), server_app (the FastAPI app and its routes), protocol, serving_*."""
