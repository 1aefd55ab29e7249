"""Shared comparison helpers for the test suite (names as upstream vLLM's tests).

- :func:`check_outputs_equal`: greedy token ids and text identical for every prompt.
- :func:`check_logprobs_close`: at the first position where two greedy runs differ, each
  run's token must be in the other's top-k logprobs; nothing after it is compared.
- :func:`fork_new_process_for_each_test`: run a test body in a forked child.
- :func:`compare_llm_settings`: run the same prompts through two LLM settings, exact compare.
- :func:`hf_greedy`: the Hugging Face transformers reference, cached on disk by the model
  file's sha256 so CI converts and runs each model once.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import json
import os
import signal
import subprocess
import sys
import traceback
import types
from collections.abc import Callable, Sequence
from typing import Any

import pytest

# (token_ids, text) or (token_ids, text, logprobs: list[dict[int, float]])
TokensText = tuple[list[int], str]
TokensTextLogprobs = tuple[list[int], str, list[dict[int, float]] | None]

# Eight short English prompts used wherever SmolLM2 is compared (CPU and GPU suites).
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "The future of AI is",
    "def fibonacci(n):",
    "List three colors:",
    "Water boils at",
    "Once upon a time,",
    "The quick brown fox",
]

CACHE_DIR = os.environ.get(
    "VLLM_TEST_CACHE", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".test_cache")
)


def _gap(lp: dict[int, float] | None) -> str:
    if not lp:
        return "n/a"
    top = sorted(lp.values(), reverse=True)[:2]
    return f"{top[0] - top[1]:.4g}" if len(top) == 2 else "n/a"


def check_outputs_equal(
    outputs_0_lst: Sequence[TokensText],
    outputs_1_lst: Sequence[TokensText],
    name_0: str,
    name_1: str,
    prompts: Sequence[Any] | None = None,
) -> None:
    """Assert greedy token ids (and texts) are identical prompt by prompt.

    On a mismatch the message gives the prompt, the first differing position and, when the
    outputs carry logprobs, the top-2 logprob gap there.
    """
    assert len(outputs_0_lst) == len(outputs_1_lst), (len(outputs_0_lst), len(outputs_1_lst))
    for i, (o0, o1) in enumerate(zip(outputs_0_lst, outputs_1_lst)):
        ids0, text0, ids1, text1 = o0[0], o0[1], o1[0], o1[1]
        if list(ids0) == list(ids1) and text0 == text1:
            continue
        pos = next((j for j, (a, b) in enumerate(zip(ids0, ids1)) if a != b), None)
        if pos is None:
            pos = min(len(ids0), len(ids1))
        gaps = ""
        if len(o0) > 2 and o0[2] and pos < len(o0[2]):
            gaps = f" top-2 gap {name_0}={_gap(o0[2][pos])}"
        if len(o1) > 2 and o1[2] and pos < len(o1[2]):
            gaps += f" {name_1}={_gap(o1[2][pos])}"
        prompt = prompts[i] if prompts is not None else i
        raise AssertionError(
            f"prompt {prompt!r}: outputs differ at position {pos}{gaps}\n"
            f"{name_0}: {list(ids0)} {text0!r}\n{name_1}: {list(ids1)} {text1!r}"
        )


def check_logprobs_close(
    outputs_0_lst: Sequence[TokensTextLogprobs],
    outputs_1_lst: Sequence[TokensTextLogprobs],
    name_0: str,
    name_1: str,
    prompts: Sequence[Any] | None = None,
) -> None:
    """Assert two greedy runs agree up to their first divergence, where each run's token
    must be among the other's returned top logprobs (docs/design.md: top-5)."""
    assert len(outputs_0_lst) == len(outputs_1_lst)
    for i, (o0, o1) in enumerate(zip(outputs_0_lst, outputs_1_lst)):
        ids0, _, lp0 = o0
        ids1, _, lp1 = o1
        for pos, (a, b) in enumerate(zip(ids0, ids1)):
            if a == b:
                continue
            prompt = prompts[i] if prompts is not None else i
            msg = (
                f"prompt {prompt!r}: position {pos}: {name_0} chose {a}, {name_1} chose {b}; "
                f"top-2 gap {name_0}={_gap(lp0[pos])} {name_1}={_gap(lp1[pos])}\n"
                f"{name_0}: {list(ids0)}\n{name_1}: {list(ids1)}"
            )
            assert a in lp1[pos], msg
            assert b in lp0[pos], msg
            break


def check_top5_logprobs_within(ref, out, name: str, tol: float = 1e-4) -> None:
    """Float32 comparison of (ids, text, top-5 {id: logprob} per position) outputs: at
    each position the two top-5 lists share at least 4 tokens, whose logprobs agree within
    ``tol`` (the tokens themselves are compared separately)."""
    for p, ((_, _, ref_lps), (_, _, lps)) in enumerate(zip(ref, out)):
        for pos, (a, b) in enumerate(zip(ref_lps, lps)):
            common = set(a) & set(b)
            assert len(common) >= 4, f"{name} prompt {p} pos {pos}: top-5 differ {a} {b}"
            for tok in common:
                diff = abs(a[tok] - b[tok])
                assert diff <= tol, f"{name} prompt {p} pos {pos} token {tok}: {diff}"


@contextlib.contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging) when the block runs longer than ``seconds``."""

    def _raise(signum, frame):
        raise TimeoutError(f"did not finish within {seconds} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def skip_old_interpreter() -> None:
    """Skip the calling test under a Triton older than 3.9 (requirements-test.txt pins 3.9.0
    on CPU hosts). The interpreter of Triton 3.6, the build a CUDA host keeps, cannot take a
    loop bound passed as a kernel argument (``range(0, K, BLOCK_K)``: "only 0-dimensional
    arrays can be converted to Python scalars"), which the GEMV and fused-expert kernels
    use; read from the package metadata, so triton is not imported here."""
    from importlib.metadata import version

    if tuple(int(p) for p in version("triton").split(".")[:2]) < (3, 9):
        pytest.skip(f"Triton {version('triton')}'s interpreter cannot run these kernels")


_INTERPRETER: dict[str, Any] = {}


def run_interpreted(test_file: str, case: str, timeout: float = 1500) -> None:
    """Run function ``case`` of ``test_file`` under ``TRITON_INTERPRET=1`` (Triton's CPU
    interpreter then executes the kernels), in a child forked by a process that has the
    flag from its start (:mod:`tests.interpreted`), with this process's environment.

    Not a fork of this process or a reload: the flag must be set before ``triton`` is
    FIRST imported, since ``triton.language``'s own jitted helpers (``tl.sum``) are wrapped
    at that import; a reload fails ("Cannot call @triton.jit'd outside of the scope of a
    kernel"), and a fork inherits the compiled triton this process imported. The
    interpreting process is started once per pytest process and kept.

    Raises:
        AssertionError: the case failed (with the end of its output), or ran ``timeout``
            seconds (the interpreter is slow, and slower on a busy machine; the
            interpreting process is then killed).
    """
    import select

    server = _interpreted_server()
    request = {"file": os.path.abspath(test_file), "case": case, "env": dict(os.environ)}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    ready, _, _ = select.select([server.stdout], [], [], timeout)
    line = server.stdout.readline() if ready else ""
    if not line:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        _INTERPRETER.clear()
        why = f"ran {timeout} s" if not ready else f"its process exited ({server.returncode})"
        raise AssertionError(f"{case} under TRITON_INTERPRET=1: {why}")
    reply = json.loads(line)
    assert reply["rc"] == 0, f"{case} failed under TRITON_INTERPRET=1:\n{reply['output']}"


def _interpreted_server() -> subprocess.Popen:
    """This process's :mod:`tests.interpreted` process, started on first use."""
    server = _INTERPRETER.get("server")
    if server is not None and _INTERPRETER["owner"] == os.getpid() and server.poll() is None:
        return server
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.interpreted"], cwd=root, env=env, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    _INTERPRETER.update(server=server, owner=os.getpid())
    return server


def fork_new_process_for_each_test(fn):
    """Run the decorated test in a forked child; the child's failure fails the test."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                fn(*args, **kwargs)
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 0 and os.WIFEXITED(status), "forked test body failed"

    return wrapper


def stage_start_method() -> str:
    """``VLLM_WORKER_MULTIPROC_METHOD`` for a test that runs torch CPU ops (a reference, a
    PP = 1 engine) in the process that then starts pipeline or tensor-parallel workers.

    "fork" when every engine and reference here runs one intra-op thread
    (``OMP_NUM_THREADS=1``, as ``.ci/run`` sets; ParallelConfig.cpu_threads reads it):
    GNU OpenMP then never starts a thread pool, so a fork copies nothing half-alive, and
    the workers inherit the imported modules instead of importing torch and the engine
    anew (seconds of CPU per worker). Otherwise "spawn": a pool does not survive a fork
    (the child's first parallel op waits forever for threads that were not copied).
    tests/distributed/test_mp_start_method.py covers both methods.
    """
    return "fork" if os.environ.get("OMP_NUM_THREADS") == "1" else "spawn"


def vllm_greedy(llm, prompts: Sequence[Any], max_tokens: int, logprobs: int | None = None):
    """Greedy outputs of an LLM as (token_ids, text, logprobs-as-floats) per prompt."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=logprobs)
    outs = llm.generate(list(prompts), params, use_tqdm=False)
    return [completion_tuple(o) for o in outs]


def completion_tuple(output) -> tuple[list[int], str, list[dict[int, float]] | None]:
    """A RequestOutput's first completion as (token_ids, text, logprobs-as-floats or None),
    the form check_outputs_equal / check_logprobs_close compare."""
    c = output.outputs[0]
    lps = None
    if c.logprobs is not None:
        lps = [{t: lp.logprob for t, lp in pos.items()} for pos in c.logprobs]
    return list(c.token_ids), c.text, lps


def compare_llm_settings(
    model: str,
    kwargs1: dict[str, Any],
    kwargs2: dict[str, Any],
    prompts: Sequence[Any],
    max_tokens: int = 32,
    exact: bool = True,
):
    """Run ``prompts`` greedily under two LLM settings (one after the other, each engine
    shut down before the next starts) and compare exactly, or logprobs-close when
    ``exact`` is False. Returns both output lists."""
    from vllm import LLM

    results = []
    for kw in (kwargs1, kwargs2):
        llm = LLM(model=model, **kw)
        results.append(vllm_greedy(llm, prompts, max_tokens, logprobs=None if exact else 5))
        llm.llm_engine.shutdown()
        del llm
        gc.collect()
    if exact:
        check_outputs_equal(results[0], results[1], str(kwargs1), str(kwargs2), prompts)
    else:
        check_logprobs_close(results[0], results[1], str(kwargs1), str(kwargs2), prompts)
    return results


_DIGESTS: dict[tuple, str] = {}


def _file_digest(path: str) -> str:
    """sha256 of a file, or of a directory's .safetensors and .json files; memoised per
    process (and inherited by forked children) while the path's identity is unchanged."""
    ident = _file_identity(path) if os.path.isfile(path) else None
    if ident is not None and ident in _DIGESTS:
        return _DIGESTS[ident]
    h = hashlib.sha256()
    files = (
        [path]
        if os.path.isfile(path)
        else sorted(
            os.path.join(path, f) for f in os.listdir(path) if f.endswith((".safetensors", ".json"))
        )
    )
    for f in files:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    if ident is not None:
        _DIGESTS[ident] = h.hexdigest()
    return h.hexdigest()


def _file_identity(path) -> tuple | None:
    """(real path, device, inode, size, mtime_ns, ctime_ns) of ``path``, or None when it
    cannot be stat'ed: a key that changes whenever the file is rewritten or replaced."""
    try:
        st = os.stat(path)
    except (OSError, TypeError, ValueError):
        return None
    real = os.path.realpath(path)
    return (real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def share_gguf_readers(maxsize: int = 4) -> None:
    """Make ``gguf.GGUFReader(path)`` return one parsed reader per file in this process
    (and in the forked children that inherit it), for the ``maxsize`` files read last.

    Why: transformers builds a GGUF file's config, its tokenizer and its weights each from
    a new ``gguf.GGUFReader``, whose parse of a file carrying SmolLM2's tokenizer (the tiny
    GGUFs copy it) takes seconds on 2 cores; a test that converts a file for its reference
    (:func:`gguf_reference_dir`) and starts an engine on it (whose config and tokenizer
    transformers converts on first use) parsed the same bytes up to five times. The reader
    (a read-only memory map and the fields parsed from it) is a function of the file: the
    key is the file's real path, device, inode, size and modification and change times, so
    a rewritten or replaced file is parsed again. Only ``gguf.GGUFReader`` itself is
    shared: its subclasses (the engine's ``gguf_checks.read_gguf``) and other modes parse
    as before. Idempotent.
    """
    import collections

    import gguf

    base = gguf.GGUFReader
    if getattr(base, "_shared_readers", None) is not None:
        return
    readers: collections.OrderedDict = collections.OrderedDict()
    identity = _file_identity

    class SharedGGUFReader(base):
        _shared_readers = readers

        def __new__(cls, path, mode="r"):
            if cls is SharedGGUFReader and mode == "r":
                key = identity(path)
                if key is not None and key in readers:
                    readers.move_to_end(key)
                    return readers[key]
            return super().__new__(cls)

        def __init__(self, path, mode="r"):
            if getattr(self, "_shared_key", None) is not None:  # a shared, parsed reader
                return
            key = identity(path) if type(self) is SharedGGUFReader and mode == "r" else None
            super().__init__(path, mode)
            if key is not None:
                self._shared_key = key
                readers[key] = self
                while len(readers) > maxsize:
                    readers.popitem(last=False)

    gguf.GGUFReader = SharedGGUFReader


def share_gguf_metadata_parses(maxsize: int = 4) -> None:
    """Make transformers' ``load_gguf_checkpoint(path, return_tensors=False)`` (a GGUF
    file's metadata as config and tokenizer dicts) run once per file in this process (and
    in the forked children that inherit it), for the ``maxsize`` files read last; each call
    returns a deep copy of that result.

    Why: transformers converts the metadata of a file, its tokenizer's 49,152 tokens and
    merges included, value by value in Python for each config it builds (AutoConfig, and
    AutoTokenizer's config), about a second on 2 cores for a file carrying SmolLM2's
    tokenizer; a test's reference (:func:`gguf_reference_dir`) and the engine's first
    conversion of the same file built it four times. The result is a function of the file
    (keyed as in :func:`share_gguf_readers`); calls that read tensors, load into a model or
    convert a dtype run as before. Idempotent; does nothing when transformers has no such
    function.
    """
    import collections
    import copy
    import inspect

    try:
        from transformers import modeling_gguf_pytorch_utils as gguf_utils
    except ImportError:
        return
    original = getattr(gguf_utils, "load_gguf_checkpoint", None)
    if original is None or getattr(original, "_shared_results", None) is not None:
        return
    signature = inspect.signature(original)
    results: collections.OrderedDict = collections.OrderedDict()

    @functools.wraps(original)
    def load_gguf_checkpoint(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        others = {k: v for k, v in bound.arguments.items() if k != "gguf_checkpoint_path"}
        key = None
        if others == {"return_tensors": False, "model_to_load": None, "torch_dtype": None}:
            key = _file_identity(bound.arguments["gguf_checkpoint_path"])
        if key is None:
            return original(*args, **kwargs)
        if key not in results:
            results[key] = original(*args, **kwargs)
            while len(results) > maxsize:
                results.popitem(last=False)
        results.move_to_end(key)
        return copy.deepcopy(results[key])

    load_gguf_checkpoint._shared_results = results
    gguf_utils.load_gguf_checkpoint = load_gguf_checkpoint


def gguf_reference_dir(path: str) -> str:
    """A Hugging Face directory holding what transformers makes of the GGUF file ``path``:
    its config, its weights dequantized to float32 (``GgufConfig(dequantize=True)``) and its
    tokenizer, converted by transformers on first use and kept in ``CACHE_DIR`` keyed by the
    file's sha256 and the transformers and gguf versions.

    Why: transformers parses the whole GGUF, the tokenizer's ~49k-entry arrays included, for
    the config, the tokenizer and the weights of every load (about 20 s for SmolLM2 or a tiny
    GGUF carrying its tokenizer, on 2 cores), and several tests load the same file. Float32
    safetensors reload bit for bit, and the weights stay checked against the engine's own
    GGUF loader and the source checkpoints (test_weight_loading.py).
    """
    import importlib.metadata

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    versions = [importlib.metadata.version(p) for p in ("transformers", "gguf")]
    key_src = json.dumps([_file_digest(path), *versions])
    key = hashlib.sha256(key_src.encode()).hexdigest()[:32]
    target = os.path.join(CACHE_DIR, f"hf_from_gguf_{key}")
    if os.path.isdir(target):
        return target
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    hf = AutoModelForCausalLM.from_pretrained(
        d,
        gguf_file=f,
        quantization_config=GgufConfig(gguf_file=f, dequantize=True),
        dtype=torch.float32,
    )
    hf.config.quantization_config = None  # the saved weights are plain float32
    tmp = f"{target}.tmp{os.getpid()}"
    hf.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    try:
        os.rename(tmp, target)
    except OSError:  # another process finished first
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    return target


def load_hf_model(
    model: str, dtype: str = "float32", device: str = "cpu", attn_implementation: str | None = None
):
    """transformers model + tokenizer for an HF directory or a .gguf file (dequantized, via
    :func:`gguf_reference_dir`); ``attn_implementation`` as transformers' argument (None:
    its default, ``sdpa`` where available)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model.endswith(".gguf"):
        model = gguf_reference_dir(model)
    tok = AutoTokenizer.from_pretrained(model)
    extra = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=getattr(torch, dtype), **extra)
    return hf.to(device).eval(), tok


def hf_greedy(
    model: str,
    prompts: Sequence[Any],
    max_tokens: int,
    dtype: str = "float32",
    device: str = "cpu",
    top_logprobs: int = 5,
    attn_implementation: str | None = None,
) -> list[TokensTextLogprobs]:
    """transformers greedy generation, one prompt at a time (no padding), with the top
    ``top_logprobs`` log_softmax entries per generated position.

    Prompts are text or ``{"prompt_token_ids": [...]}``. Generation stops at EOS like the
    engine, and the text is the decode without a trailing incomplete character, as the
    engine's (vllm/engine/detokenizer.py). Each prompt's result is cached in ``CACHE_DIR``
    keyed by the model's sha256, the prompt, max_tokens, dtype, device, top_logprobs and
    attn_implementation, so calls with overlapping prompt lists generate each prompt once;
    the model is loaded only when a prompt is not cached.
    """
    digest = _file_digest(model)
    paths = []
    for p in prompts:
        key_args = [digest, p, max_tokens, dtype, device, top_logprobs, attn_implementation]
        key = hashlib.sha256(json.dumps(key_args).encode()).hexdigest()[:32]
        paths.append(os.path.join(CACHE_DIR, f"hf_greedy1_{key}.json"))
    found = {path: _read_greedy(path) for path in paths}
    missing = {path: prompt for path, prompt in zip(paths, prompts) if found[path] is None}
    if missing:
        hf, tok = load_hf_model(model, dtype, device, attn_implementation)
        os.makedirs(CACHE_DIR, exist_ok=True)
        for path, prompt in missing.items():
            found[path] = _hf_generate(hf, tok, prompt, max_tokens, top_logprobs)
            tmp = path + f".{os.getpid()}.tmp"
            with open(tmp, "w") as fh:
                json.dump(found[path], fh)
            os.replace(tmp, path)
    return [found[path] for path in paths]


def _read_greedy(path: str) -> TokensTextLogprobs | None:
    """One prompt's cached :func:`hf_greedy` result (logprob keys back to ints), or None."""
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        ids, text, lps = json.load(fh)
    return ids, text.rstrip("\ufffd"), [{int(k): v for k, v in p.items()} for p in lps]


def _hf_generate(hf, tok, prompt: Any, max_tokens: int, top_logprobs: int) -> TokensTextLogprobs:
    """One prompt through transformers' greedy ``generate`` (see :func:`hf_greedy`)."""
    import torch

    ids = prompt["prompt_token_ids"] if isinstance(prompt, dict) else tok.encode(prompt)
    inp = torch.tensor([ids], device=hf.device)
    with torch.no_grad():
        out = hf.generate(
            inp,
            attention_mask=torch.ones_like(inp),
            max_new_tokens=max_tokens,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=tok.eos_token_id,
        )
    gen = out.sequences[0, len(ids) :].tolist()
    if tok.eos_token_id in gen:
        gen = gen[: gen.index(tok.eos_token_id) + 1]
    lps = []
    for step_scores in out.scores[: len(gen)]:
        lp = torch.log_softmax(step_scores[0].float(), dim=-1)
        vals, idx = lp.topk(top_logprobs)
        lps.append({int(i): float(v) for v, i in zip(vals, idx)})
    text = tok.decode(gen, skip_special_tokens=True).rstrip("\ufffd")
    return gen, text, lps


def check_gguf_matches_source(
    hf_dir: str, gguf_path: str, prompts: Sequence[Any], max_tokens: int, name: str,
    min_distinct: int = 6, tol: float = 1e-4,
) -> None:  # fmt: skip
    """The engine on a GGUF file against transformers on the Hugging Face checkpoint it was
    written from (the same float32 weights; for what transformers' GGUF reader drops):
    greedy ids equal (token-id prompts: the two tokenizers may differ) and top-5 logprobs
    within ``tol`` (float32 on CPU: the same arithmetic). Each reference output must have
    ``min_distinct`` distinct tokens (docs/design.md: a repeating model proves nothing)."""
    from vllm import LLM

    ref = hf_greedy(hf_dir, prompts, max_tokens)
    for ids, _, _ in ref:
        assert len(set(ids)) >= min_distinct, f"{name}: degenerate output {ids}"
    llm = LLM(model=gguf_path, device="cpu", dtype="float32")
    out = vllm_greedy(llm, prompts, max_tokens, logprobs=5)
    llm.llm_engine.shutdown()
    check_outputs_equal(
        [(ids, "") for ids, _, _ in ref], [(ids, "") for ids, _, _ in out], "hf-source",
        f"{name}-gguf", prompts,
    )  # fmt: skip
    for p, ((_, _, ref_lps), (_, _, lps)) in enumerate(zip(ref, out)):
        for pos, (a, b) in enumerate(zip(ref_lps, lps)):
            for tok in set(a) & set(b):
                assert abs(a[tok] - b[tok]) <= tol, (name, p, pos, tok)


def run_engine_script(script: str, *args: str, cwd, timeout: int):
    """``python -c script *args`` in a fresh interpreter (``subprocess.CompletedProcess``
    with text stdout / stderr): this checkout first on PYTHONPATH, a 0.05 GiB CPU KV cache,
    the hub offline, and workers started by fork (VLLM_WORKER_MULTIPROC_METHOD unset), so
    they inherit what the script patches in."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "0.05", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")])
    env.pop("VLLM_WORKER_MULTIPROC_METHOD", None)
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


# Python's warning filters with no -W option or PYTHONWARNINGS (a fresh interpreter's).
_FRESH_WARNING_FILTERS = [
    ("default", None, DeprecationWarning, "__main__", 0),
    ("ignore", None, DeprecationWarning, None, 0),
    ("ignore", None, PendingDeprecationWarning, None, 0),
    ("ignore", None, ImportWarning, None, 0),
    ("ignore", None, ResourceWarning, None, 0),
]


def _as_fresh_process(env: dict | None, cwd: str | None) -> None:
    """In a forked child: logging, warnings and the environment as a new interpreter has
    them (pytest's capture handlers and warning recorders removed), then ``env`` and
    ``cwd`` applied."""
    import logging
    import warnings

    root = logging.getLogger()
    root.handlers.clear()  # pytest's capture handlers
    root.setLevel(logging.WARNING)
    for name, logger in logging.root.manager.loggerDict.items():
        if not isinstance(logger, logging.Logger):
            continue
        if name == "vllm" or name.startswith("vllm."):  # configured by the command itself
            logger.handlers.clear()
            logger.setLevel(logging.NOTSET)
        else:  # a library's own setup (transformers') stays; pytest's handlers go
            logger.handlers[:] = [
                h for h in logger.handlers if not type(h).__module__.startswith("_pytest")
            ]
    warnings.filters[:] = list(_FRESH_WARNING_FILTERS)
    warnings.showwarning = warnings._showwarning_orig
    os.environ.update(env or {})
    if cwd is not None:
        os.chdir(cwd)


def _cli_child(argv: list[str], env: dict | None, cwd: str | None, out_fd: int, err_fd: int):
    """The body of a forked child that runs ``vllm ARGV`` as a new interpreter would (see
    :func:`run_cli`); never returns."""
    import logging
    import multiprocessing.process
    import multiprocessing.util

    code = 1
    try:
        # What this process owns stays the parent's: its objects are never collected here
        # (a garbage temporary file of the parent would be unlinked), its multiprocessing
        # children and finalizers are not this child's (as multiprocessing's own children).
        gc.freeze()
        multiprocessing.process._children = set()
        multiprocessing.util._finalizer_registry.clear()
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _as_fresh_process(env, cwd)
        from vllm.entrypoints import cli

        sys.argv = [cli.__file__, *argv]
        code = cli.main(argv) or 0
    except SystemExit as e:
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):  # what a normal exit does (atexit)
            multiprocessing.util._exit_function()  # the command's own child processes
            logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


class ForkedCommand:
    """``vllm ARGV`` (``vllm.entrypoints.cli.main``) in a forked child that leads its own
    session, as ``python -m vllm.entrypoints.cli ARGV`` runs it: stdin from /dev/null,
    stdout and stderr to ``out_fd`` / ``err_fd``, SIGINT and SIGTERM as a new interpreter
    has them, logging and warnings as in a new interpreter (:func:`_as_fresh_process`),
    ``env`` added to the environment. The child inherits this process's imports, so it
    starts in a fraction of a second instead of an interpreter start and a torch import.

    Popen's interface: ``args``, ``pid``, ``returncode``, :meth:`poll`, :meth:`wait`,
    :meth:`send_signal`, :meth:`terminate` (SIGTERM) and :meth:`kill` (SIGKILL).
    """

    def __init__(
        self, argv: Sequence[str], out_fd: int, err_fd: int, env: dict | None = None,
        cwd: str | None = None,
    ):  # fmt: skip
        self.args = ["vllm", *argv]
        self.returncode: int | None = None
        pid = os.fork()
        if pid == 0:
            os.setsid()
            _cli_child(list(argv), env, cwd, out_fd, err_fd)
        self.pid = pid

    def poll(self) -> int | None:
        """The exit status once the child has exited (``-N`` for signal N), else None."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the exit status.

        Raises:
            subprocess.TimeoutExpired: still running after ``timeout`` seconds.
        """
        import time

        end = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if end is not None and time.monotonic() > end:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.02)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_vllm_commands(module: Any, monkeypatch) -> None:
    """Make ``module``'s ``subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.cli",
    *argv], stdout=FILE, stderr=FILE or STDOUT, env=ENV, ...)`` a :class:`ForkedCommand`
    of ``argv`` (a benchmark script's ``vllm serve``), for the rest of the test; any other
    command runs as before. ``monkeypatch`` undoes it."""
    cli_prefix = [sys.executable, "-m", "vllm.entrypoints.cli"]

    def popen(cmd, *args, stdout=None, stderr=None, env=None, **kwargs):
        if args or list(cmd[:3]) != cli_prefix or stdout is None or stderr is None:
            return subprocess.Popen(cmd, *args, stdout=stdout, stderr=stderr, env=env, **kwargs)
        out_fd = stdout.fileno()
        err_fd = out_fd if stderr == subprocess.STDOUT else stderr.fileno()
        return ForkedCommand(list(cmd[3:]), out_fd, err_fd, env=env, cwd=kwargs.get("cwd"))

    shim = types.SimpleNamespace(**{**vars(subprocess), "Popen": popen})
    monkeypatch.setattr(module, "subprocess", shim)


def run_cli(
    *args: str, env: dict | None = None, cwd: str | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """``vllm ARGS`` in a forked child (:class:`ForkedCommand`), to completion; its exit
    status is ``main``'s return value or ``SystemExit``'s code. Returns a
    CompletedProcess with the text of its stdout and stderr.

    Raises:
        subprocess.TimeoutExpired: the command ran ``timeout`` seconds (it is killed).
    """
    import tempfile

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = ForkedCommand(args, out.fileno(), err.fileno(), env, cwd)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
        texts = []
        for fh in (out, err):
            fh.seek(0)
            texts.append(fh.read().decode(errors="replace"))
    return subprocess.CompletedProcess(proc.args, code, texts[0], texts[1])


def run_in_fork(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a forked child (a fresh engine beside a running server, say) and
    return its JSON-able result; the child's failure fails the caller's assertion."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            with os.fdopen(w, "w") as fh:
                fh.write(json.dumps(fn()))
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        data = fh.read()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "forked reference failed"
    return json.loads(data)


@contextlib.contextmanager
def virtual_engines_override(num_ves: int):
    """Inside the block, every engine built from EngineArgs (``LLM``, ``LLMEngine``,
    ``AsyncLLMEngine``) gets ``EngineConfig.num_virtual_engines_override = num_ves``: several
    virtual engines without pipeline parallelism (a test-only setting with no CLI flag).

    The config is edited after ``EngineArgs.create_engine_config`` built it (with several
    VEs, async output processing off, as ``EngineArgs`` decides for PP), then verified
    again; the original method is restored on exit.
    """
    from vllm.engine.arg_utils import EngineArgs

    original = EngineArgs.create_engine_config

    def create(self, *args, **kwargs):
        config = original(self, *args, **kwargs)
        config.num_virtual_engines_override = num_ves
        if num_ves > 1:  # the engine overlaps output processing with one VE only
            config.model_config.use_async_output_proc = False
        config.verify()
        return config

    EngineArgs.create_engine_config = create
    try:
        yield
    finally:
        EngineArgs.create_engine_config = original


# ------------------------------------------------------------------ OpenAI server helpers
class RemoteOpenAIServer:
    """``vllm serve MODEL --port 0 ...`` in a forked child (:class:`ForkedCommand`), or a
    ``launcher`` script as a subprocess, on a free loopback port (the port the server
    bound is read from its log), killed on ``stop()``.

    Args:
        model: model path given to ``vllm serve``.
        args: extra CLI flags (``["--device", "cpu", ...]``).
        env: extra environment; VLLM_CPU_KVCACHE_SPACE defaults to 0.25 GiB.
        timeout: seconds to wait for /health.
        launcher: a Python script run instead of ``-m vllm.entrypoints.cli`` with the same
            arguments (a test's own entry point, e.g. one that patches the engine to inject
            faults before it calls ``vllm.entrypoints.cli.main``).
    """

    def __init__(
        self,
        model: str,
        args: Sequence[str],
        env: dict | None = None,
        timeout=300,
        launcher: str | None = None,
    ):
        import re
        import subprocess
        import tempfile
        import time

        import httpx

        extra_env = {"VLLM_CPU_KVCACHE_SPACE": "0.25", "HF_HUB_OFFLINE": "1", **(env or {})}
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm_serve_", suffix=".log")
        argv = ["serve", model, "--host", "127.0.0.1", "--port", "0", *args]
        if launcher is None:  # a forked child: no interpreter start, no torch import
            self.proc = ForkedCommand(argv, self.log.fileno(), self.log.fileno(), extra_env)
        else:
            self.proc = subprocess.Popen(
                [sys.executable, launcher, *argv], env={**os.environ, **extra_env},
                stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.time() + timeout
        self.port = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", self.read_log())
            if m:
                self.port = int(m.group(1))
                try:
                    if httpx.get(self.url_for("health"), timeout=5).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server did not start in {timeout} s:\n{self.log_tail()}")

    def read_log(self) -> str:
        with open(self.log.name) as fh:
            return fh.read()

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.read_log().splitlines()[-n:])

    def url_for(self, *parts: str) -> str:
        return f"http://127.0.0.1:{self.port}/" + "/".join(parts)

    def get_client(self, api_key: str = "EMPTY", **kw):
        import openai

        return openai.OpenAI(base_url=self.url_for("v1"), api_key=api_key, max_retries=0, **kw)

    def get_async_client(self, api_key: str = "EMPTY", **kw):
        import openai

        return openai.AsyncOpenAI(base_url=self.url_for("v1"), api_key=api_key, max_retries=0, **kw)

    def stop(self, sig: int | None = None, timeout: float = 60) -> int | None:
        """Send ``sig`` (SIGTERM) to the server, wait, SIGKILL its group if it hangs;
        returns its exit code."""
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(sig or signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def server_answers(
    server: RemoteOpenAIServer, prompts: Sequence[str], max_tokens: int, seeded: bool = True
) -> list[tuple[str, list[str] | None, str]]:
    """Per prompt: (greedy completion text, the two texts of a seeded sampled completion
    (temperature 1, seed 0, n=2; None unless ``seeded``), greedy chat reply) from a running
    server, each ``max_tokens`` long at most."""
    client = server.get_client()
    name = client.models.list().data[0].id  # the served name, not the path
    out = []
    for p in prompts:
        greedy = client.completions.create(
            model=name, prompt=p, max_tokens=max_tokens, temperature=0.0
        )
        sampled = None
        if seeded:
            sampled = client.completions.create(
                model=name, prompt=p, max_tokens=max_tokens, temperature=1.0, seed=0, n=2
            )
        chat = client.chat.completions.create(
            model=name,
            messages=[{"role": "user", "content": p}],
            max_tokens=max_tokens,
            temperature=0.0,
        )
        out.append(
            (
                greedy.choices[0].text,
                [c.text for c in sampled.choices] if sampled else None,
                chat.choices[0].message.content,
            )
        )
    return out


def compare_two_settings(
    model: str,
    args1: Sequence[str],
    args2: Sequence[str],
    prompts: Sequence[str] = ("The capital of France is", "Hello, my name is"),
    max_tokens: int = 8,
    env: dict | None = None,
    base_args: Sequence[str] = ("--device", "cpu", "--max-model-len", "512"),
    seeded: bool = True,
    server1: RemoteOpenAIServer | None = None,
    on_server2: Callable[[RemoteOpenAIServer], None] | None = None,
):
    """Start the server with ``args1``, then with ``args2`` (one at a time), and assert
    greedy completions, seeded sampled completions (temperature 1, seed 0, n=2; skipped
    when ``seeded`` is False, e.g. against speculative decoding, whose rejection sampler
    draws differently) and greedy chat replies are identical. Returns both result lists.

    ``server1``: an already running server started with ``base_args + args1`` (a module
    fixture shared by several comparisons), used instead of starting one; ``env`` then
    applies to the second server only. ``on_server2(server)`` runs more checks against
    the second server before it stops."""
    results = []
    if server1 is not None:
        results.append(server_answers(server1, prompts, max_tokens, seeded))
    for args in (args1, args2)[len(results) :]:
        with RemoteOpenAIServer(model, [*base_args, *args], env=env) as server:
            results.append(server_answers(server, prompts, max_tokens, seeded))
            if on_server2 is not None and len(results) == 2:
                on_server2(server)
    for p, a, b in zip(prompts, results[0], results[1]):
        assert a == b, f"prompt {p!r}: {args1} gave {a!r}, {args2} gave {b!r}"
    return results
