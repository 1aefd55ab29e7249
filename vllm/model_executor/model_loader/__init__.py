"""Model loading: ``get_model(model_config, device, pp_rank=0, pp_size=1)``."""

from vllm.model_executor.model_loader.loader import get_model, resolve_load_format

__all__ = ["get_model", "resolve_load_format"]
