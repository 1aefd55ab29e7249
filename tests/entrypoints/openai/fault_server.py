"""`vllm serve` with a fault injected from the test side (run by RemoteOpenAIServer as its
launcher): output processing of a request whose prompt contains FAULT raises, so the
server must fail that request alone (HTTP 500) and keep serving.

Usage: ``python fault_server.py serve MODEL [flags]`` (the arguments of ``vllm``).
"""

import sys

from vllm.engine.llm_engine import LLMEngine
from vllm.entrypoints.cli import main

FAULT = "FAULT-INJECT-7f3a"

_process = LLMEngine._process_group_output


def _faulty_process(self, group, group_out):
    if FAULT in (group.prompt or ""):
        raise RuntimeError(f"injected fault in {group.request_id}")
    return _process(self, group, group_out)


LLMEngine._process_group_output = _faulty_process

if __name__ == "__main__":
    sys.exit(main())
