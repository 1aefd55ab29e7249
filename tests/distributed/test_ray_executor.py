"""The Ray executor on CPU: PP=2 over Ray actors, exact vs PP=1 (float32, gloo).

Each test starts its own small Ray cluster (2 CPUs, no dashboard, ~80 MB object store) in a
forked child and shuts it down in ``finally``. The GPU test (PP=2 Ray vs PP=1 and vs PP=2
mp on SmolLM2 with CUDA graphs) is at the end, marked ``multi_gpu(2)``. The deadlines
guard against hangs only: on a busy 2-core host each actor's start (a fresh Python that
imports torch) can take a minute.
"""

import contextlib
import time

import pytest

from tests.utils import check_logprobs_close, check_outputs_equal, deadline, vllm_greedy

ray = pytest.importorskip("ray")

# Local Ray clusters: one test at a time under pytest-xdist (.ci/run).
pytestmark = pytest.mark.xdist_group("ray")

PROMPTS = ["Hello world", "The capital of France is", "a b c d e f", "one two three four"]
SMOLLM2_PROMPTS = [
    "The capital of France is",
    "Hello, my name is",
    "def fibonacci(n):",
    "Once upon a time,",
]


@contextlib.contextmanager
def local_ray(num_cpus: int = 2):
    """A small local Ray cluster for one test, always shut down."""
    ray.init(
        num_cpus=num_cpus,
        include_dashboard=False,
        object_store_memory=80 * 1024**2,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


def _llm(model, **kw):
    from vllm import LLM

    return LLM(model=model, device="cpu", dtype="float32", **kw)


@pytest.fixture(autouse=True)
def _small_kv_cache(monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "0.05")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


@pytest.mark.forked
def test_ray_pp2_equals_pp1_and_cleans_up(tiny_llama_dir):
    """PP=3 on a 2-CPU cluster says what is needed and seen. 3 layers over 2 Ray actors give
    PP=1's greedy tokens exactly; the stages are actors of one placement group on this
    node; shutdown kills them and removes the group."""
    from ray.util.placement_group import placement_group_table

    with deadline(300):
        llm = _llm(tiny_llama_dir)
        try:
            ref = vllm_greedy(llm, PROMPTS, 16)
        finally:
            llm.llm_engine.shutdown()
        with local_ray(2):
            with pytest.raises(RuntimeError, match=r"need 3 CPUs .* has 2"):
                _llm(tiny_llama_dir, pipeline_parallel_size=3, distributed_executor_backend="ray")
            t0 = time.perf_counter()
            llm = _llm(tiny_llama_dir, pipeline_parallel_size=2, distributed_executor_backend="ray")
            ex = llm.llm_engine.executor
            try:
                out = vllm_greedy(llm, PROMPTS, 16)
                in_flight = llm.llm_engine.max_steps_in_flight
                assert type(ex).__name__ == "RayExecutor"
                assert not ex.started_ray  # it joined the cluster this test started
                assert len(ex.actors) == 2
                assert all(isinstance(a, ray.actor.ActorHandle) for a in ex.actors)
                pg_id = ex.placement_group.id.hex()
                assert [i["placement_group_id"] for i in ex.node_infos] == [pg_id, pg_id]
                assert len({i["pid"] for i in ex.node_infos}) == 2
                this_node = ray.get_runtime_context().get_node_id()
                assert {i["node_id"] for i in ex.node_infos} == {this_node}
                assert placement_group_table(ex.placement_group)["state"] == "CREATED"
                assert ray.available_resources().get("CPU", 0) == 0  # both CPUs reserved
                pids = [i["pid"] for i in ex.node_infos]
                # Ray pickles calls with cloudpickle: a lambda reaches each stage's model
                ranges = llm.apply_model(lambda m: (m.model.start_layer, m.model.end_layer))
                assert ranges == [(0, 2), (2, 3)]  # get_pp_indices(3 layers, rank, 2)
            finally:
                llm.llm_engine.shutdown()
            print(f"PP=2 ray: {time.perf_counter() - t0:.1f} s")
            check_outputs_equal(ref, out, "pp1", "pp2-ray", PROMPTS)
            assert all(len(ids) == 16 for ids, _, _ in out)
            assert in_flight == 2  # the pipelined path: one step per VE in flight
            # Shutdown: actors dead, placement group removed, resources back.
            assert placement_group_table(ex.placement_group)["state"] == "REMOVED"
            for pid in pids:
                for _ in range(50):
                    try:
                        import os

                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(0.1)
                else:
                    raise AssertionError(f"actor process {pid} is still alive after shutdown")
            assert ray.is_initialized()  # the test's cluster is not the executor's to stop
    assert not ray.is_initialized()


def _kill_idle_actor(llm) -> None:
    """A stage actor killed while no step is in flight marks the executor failed on its own
    (its life-long watch call fails), naming the rank; the next generate raises that error
    instead of hanging or answering from a dead pipeline."""
    ex = llm.llm_engine.executor
    assert len(vllm_greedy(llm, PROMPTS[:1], 4)[0][0]) == 4
    assert not ex.failed
    ray.kill(ex.actors[0], no_restart=True)
    for _ in range(300):  # the watch's failure arrives on Ray's callback thread
        if ex.failed:
            break
        time.sleep(0.1)
    assert ex.failed, "an idle actor's death went unnoticed for 30 s"
    assert "rank 0" in str(ex._error) and "died" in str(ex._error), ex._error
    with pytest.raises(RuntimeError, match="rank 0"):
        vllm_greedy(llm, PROMPTS[:1], 4)


def _kill_actor_mid_step(llm) -> None:
    """Killing stage 1's actor right after a step was submitted to it (so stage 0 may see
    a gloo error first) fails generate with an error naming rank 1 and its node, without
    hanging; later calls raise the same error."""
    ex = llm.llm_engine.executor
    submit = ex.execute_model_async
    calls = []

    def submit_then_kill(request):
        fut = submit(request)
        calls.append(1)
        if len(calls) == 3:  # mid-generation, with a step in flight on both stages
            ray.kill(ex.actors[1], no_restart=True)
        return fut

    assert len(vllm_greedy(llm, PROMPTS[:1], 4)[0][0]) == 4
    ex.execute_model_async = submit_then_kill
    t0 = time.perf_counter()
    with pytest.raises(RuntimeError) as err:
        vllm_greedy(llm, PROMPTS, 32)
    msg = str(err.value)
    assert "rank 1" in msg and "died" in msg, msg
    assert ex.node_infos[1]["node_ip"] in msg and str(ex.node_infos[1]["pid"]) in msg
    assert time.perf_counter() - t0 < 30
    assert len(calls) >= 3 and ex.failed
    with pytest.raises(RuntimeError, match="rank 1"):
        ex.collective_rpc("get_cache_block_size_bytes")


@pytest.mark.forked
def test_actor_death_fails_the_executor_naming_the_rank(tiny_llama_dir):
    """An actor's death, idle (:func:`_kill_idle_actor`) or mid-step
    (:func:`_kill_actor_mid_step`), fails the executor with an error naming the rank; each
    engine's shutdown afterwards is clean, and the cluster serves the next engine."""
    with deadline(300), local_ray(2):
        for kill in (_kill_idle_actor, _kill_actor_mid_step):
            llm = _llm(tiny_llama_dir, pipeline_parallel_size=2, distributed_executor_backend="ray")
            ex = llm.llm_engine.executor
            try:
                kill(llm)
            finally:
                llm.llm_engine.shutdown()
            assert ex.actors == [], kill.__name__


@pytest.mark.forked
def test_own_cluster_started_and_stopped(tiny_llama_dir):
    """Without a running cluster the executor starts its own and stops it on shutdown."""
    with deadline(300):
        assert not ray.is_initialized()
        llm = _llm(tiny_llama_dir, pipeline_parallel_size=2, distributed_executor_backend="ray")
        try:
            assert llm.llm_engine.executor.started_ray and ray.is_initialized()
            assert len(vllm_greedy(llm, PROMPTS[:2], 4)[1][0]) == 4
        finally:
            llm.llm_engine.shutdown()
        assert not ray.is_initialized()


def test_missing_ray_names_the_extra(monkeypatch):
    """Without Ray the error names the ``vllm[ray]`` extra."""
    import sys

    from vllm.executor import ray_executor

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ImportError, match=r"vllm\[ray\]"):
        ray_executor.import_ray()


@pytest.mark.forked
@pytest.mark.multi_gpu(2)
def test_gpu_ray_pp2_smollm2_graphs(smollm2_gguf):
    """2 GPUs: PP=2 over Ray with CUDA graphs is logprobs-close to PP=1 and exactly equal to
    PP=2 with the mp executor (same stages, same kernels, same batches). Not yet run."""
    common = dict(model=smollm2_gguf, device="cuda", max_model_len=512, enforce_eager=False)

    def run(**kw):
        from vllm import LLM

        llm = LLM(**common, **kw)
        try:
            return vllm_greedy(llm, SMOLLM2_PROMPTS, 32, logprobs=5)
        finally:
            llm.llm_engine.shutdown()

    with deadline(600):
        pp1 = run()
        mp = run(pipeline_parallel_size=2, distributed_executor_backend="mp")
        with local_ray(num_cpus=4):
            rp = run(pipeline_parallel_size=2, distributed_executor_backend="ray")
    assert rp[0][1].startswith(" Paris"), rp[0][1]
    check_logprobs_close(pp1, rp, "pp1", "pp2-ray", SMOLLM2_PROMPTS)
    check_outputs_equal(mp, rp, "pp2-mp", "pp2-ray", SMOLLM2_PROMPTS)
