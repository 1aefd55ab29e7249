"""Default logging for the ``vllm`` loggers.

``LLM()`` and the ``vllm`` command call :func:`configure_logging`, so the start-up summary
and the other INFO lines reach stderr even in a script that never set up logging. An
application that configured logging itself (any handler on the root or ``vllm`` logger)
is left alone.
"""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def configure_logging(level: int = logging.INFO) -> None:
    """Send ``vllm.*`` records of ``level`` and above to stderr, unless the root or the
    ``vllm`` logger already has a handler (then only the ``vllm`` logger's level is set
    when it has none)."""
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.level == logging.NOTSET:
        vllm_logger.setLevel(level)
    if vllm_logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    vllm_logger.addHandler(handler)
