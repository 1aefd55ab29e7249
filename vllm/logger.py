"""Default logging for the ``vllm`` loggers.

``LLM()`` and the ``vllm`` command call :func:`configure_logging`, so the start-up summary
and the other INFO lines reach stderr even in a script that never set up logging. An
application that configured logging itself (any handler on the root or ``vllm`` logger)
is left alone. As upstream, ``VLLM_LOGGING_LEVEL`` sets the level (default INFO) and
``VLLM_CONFIGURE_LOGGING=0`` turns all of this off.
"""

from __future__ import annotations

import logging
import sys

LOG_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"


def logging_level() -> int:
    """The level ``VLLM_LOGGING_LEVEL`` names (default INFO), as a ``logging`` constant."""
    from vllm import envs

    return getattr(logging, envs.VLLM_LOGGING_LEVEL)


def configure_logging(level: int | None = None) -> None:
    """Send ``vllm.*`` records of ``level`` (default :func:`logging_level`) and above to
    stderr, unless the root or the ``vllm`` logger already has a handler (then only the
    ``vllm`` logger's level is set when it has none); nothing with
    ``VLLM_CONFIGURE_LOGGING=0``."""
    from vllm import envs

    if not envs.VLLM_CONFIGURE_LOGGING:
        return
    level = logging_level() if level is None else level
    vllm_logger = logging.getLogger("vllm")
    if vllm_logger.level == logging.NOTSET:
        vllm_logger.setLevel(level)
    if vllm_logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    vllm_logger.addHandler(handler)


def configure_command_logging(debug: bool = False) -> None:
    """The ``vllm`` commands' logging (``serve``, ``run-batch``): ``logging.basicConfig`` on
    stderr at DEBUG (``--debug``) or :func:`logging_level`, so every library's records show
    too; nothing with ``VLLM_CONFIGURE_LOGGING=0``."""
    from vllm import envs

    if not envs.VLLM_CONFIGURE_LOGGING:
        return
    level = logging.DEBUG if debug else logging_level()
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr)
