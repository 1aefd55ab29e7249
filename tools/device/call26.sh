#!/usr/bin/env bash
# Session 11, one H200: the draft's CUDA graph memory now comes off the KV budget
# (SpecDecodeWorker.determine_num_available_blocks). Its estimate against what the draft's
# capture really took, then the spec GPU suite on that code.
source tools/device/env.sh || exit 1
cap_runtime ${CAP:-450}
: > $O/bench.log
python - <<'PY' 2>&1 | grep -E "Memory profile|Speculative KV|KV cache:|draft graphs|Traceback|Error" | tee $O/draft_budget.log
import logging
logging.basicConfig(level=logging.INFO)
import sys; sys.path.insert(0, "tests/models")
from tiny_models import smollm2_gguf_path
from vllm import LLM, SamplingParams
m = smollm2_gguf_path()
llm = LLM(model=m, dtype="bfloat16", gpu_memory_utilization=0.3, max_model_len=512,
          speculative_model=m, num_speculative_tokens=4)
w = llm.llm_engine.executor.worker
for name, x in (("target", w.target), ("draft", w.draft_worker)):
    g = x.model_runner.graph_runner
    print(f"draft graphs check: {name} capture {g.capture_bytes / 2**30:.3f} GiB")
out = llm.generate(["The capital of France is"], SamplingParams(max_tokens=8, temperature=0))
print("draft graphs check: text", repr(out[0].outputs[0].text))
PY
python -m pytest --forked -q -p no:cacheprovider -rs tests/spec_decode/test_spec_gpu.py \
    2>&1 | tail -n 8 > $O/t_spec.log
kill "$CAP_PID" 2>/dev/null
grep -E "passed|failed|FAILED|Error|assert" $O/t_spec.log | tail -n 20
