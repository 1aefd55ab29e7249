"""`vllm serve` stops cleanly (tiny Llama on CPU, one server per test, loopback only).

Guards: /health answered 200 after a pipeline worker was killed, and the server kept
running (now 503, the request in flight fails with an error event, a stream asked for
after the death is a 503 rather than a 200 carrying the error, and the process exits with
status 1 so a supervisor restarts it); a graceful stop whose --shutdown-timeout ran
out cut streams without a final chunk or ``[DONE]``; a drain test that depended on how
fast the machine generates (the drain test below gives the timeout 300 s, the cut-off test
gives 0.5 s against 500-token streams).
"""

import json
import os
import signal
import threading
import time

import httpx
import psutil
import pytest

from tests.utils import RemoteOpenAIServer


def _descendants(server) -> list[psutil.Process]:
    return psutil.Process(server.proc.pid).children(recursive=True)


def _assert_gone(procs: list[psutil.Process], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    alive = procs
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes left behind: {[p.pid for p in alive]}")


def _assert_aborted_cleanly(server, streams, procs, aborted: int = 3) -> None:
    """Each 500-token stream ended early with finish_reason "abort" and [DONE]; the log has
    no traceback and reports the ``aborted`` requests; no process is left."""
    for s in streams:
        s.join(30)
        chunks = s.chunks()
        assert s.events[-1] == "[DONE]", s.events[-3:]
        assert chunks[-1]["choices"][0]["finish_reason"] == "abort"
        assert 1 <= len(chunks) < 500
    log = server.read_log()
    assert "Traceback" not in log and f"Aborted {aborted} request(s)" in log, server.log_tail()
    _assert_gone(procs)


class _Stream(threading.Thread):
    """Reads one streaming completion; ``events`` holds each decoded data event."""

    def __init__(self, server, max_tokens: int):
        super().__init__(daemon=True)
        self.url = server.url_for("v1", "completions")
        self.body = {"prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True}
        self.body |= {"ignore_eos": True, "temperature": 0}
        self.events: list = []
        self.first = threading.Event()

    def run(self):
        try:
            with httpx.stream("POST", self.url, json=self.body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        data = line[len("data: ") :]
                        self.events.append(data if data == "[DONE]" else json.loads(data))
                        self.first.set()
        except httpx.HTTPError as e:  # recorded; the assertions say what was expected
            self.events.append(e)
        finally:
            self.first.set()

    def chunks(self) -> list[dict]:
        return [e for e in self.events if isinstance(e, dict) and e.get("choices")]


@pytest.mark.forked
def test_dead_pipeline_worker_fails_health_and_exits_nonzero(tiny_llama_dir):
    args = ["--device", "cpu", "--max-model-len", "256", "--pipeline-parallel-size", "2"]
    # spawned stages are found by their command line (forked ones would look like the server)
    env = {"VLLM_CPU_KVCACHE_SPACE": "0.1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
    server = RemoteOpenAIServer(tiny_llama_dir, args, env=env)
    try:
        procs = _descendants(server)
        workers = [p for p in procs if "spawn_main" in " ".join(p.cmdline())]
        assert len(workers) == 2, [p.cmdline() for p in procs]
        stream = _Stream(server, 240)
        stream.start()
        assert stream.first.wait(120)
        os.kill(workers[1].pid, signal.SIGKILL)
        codes, deadline = [], time.monotonic() + 30
        while time.monotonic() < deadline and 503 not in codes:
            try:
                codes.append(httpx.get(server.url_for("health"), timeout=10).status_code)
            except httpx.HTTPError as e:
                codes.append(repr(e))
            time.sleep(0.05)
        assert 503 in codes, codes
        # A stream asked for now gets the 503 as its status (its headers are not sent
        # yet), not a 200 whose only event is the error.
        body = {"prompt": "Once upon a time", "max_tokens": 5, "stream": True}
        late = httpx.post(server.url_for("v1", "completions"), json=body, timeout=10)
        assert late.status_code == 503, (late.status_code, late.text)
        assert "pipeline worker rank 1" in late.json()["error"]["message"], late.text
        assert server.proc.wait(60) == 1, server.log_tail()
        stream.join(30)
        assert not stream.is_alive()
        errors = [e for e in stream.events if isinstance(e, dict) and "error" in e]
        assert errors and "pipeline worker rank 1" in errors[0]["error"]["message"], errors
        assert stream.events[-1] == "[DONE]"
        assert len(stream.chunks()) < 240
        _assert_gone(procs)
    finally:
        server.stop()


@pytest.mark.forked
def test_sigterm_drains_streams_within_shutdown_timeout(tiny_llama_dir):
    """A generous --shutdown-timeout: every stream in flight finishes all its tokens."""
    args = ["--device", "cpu", "--max-model-len", "256", "--shutdown-timeout", "300"]
    server = RemoteOpenAIServer(tiny_llama_dir, args)
    try:
        procs = _descendants(server)
        streams = [_Stream(server, 100) for _ in range(3)]
        for s in streams:
            s.start()
        assert all(s.first.wait(120) for s in streams)
        assert server.stop(signal.SIGTERM, timeout=320) == 0, server.log_tail()
        for s in streams:
            s.join(30)
            chunks = s.chunks()
            assert len(chunks) == 100 and s.events[-1] == "[DONE]", s.events[-3:]
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "Traceback" not in server.read_log(), server.log_tail()
        _assert_gone(procs)
    finally:
        server.stop()


@pytest.mark.forked
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_the_process_group_drains_pipeline_streams(tiny_llama_dir, sig):
    """A terminal's Ctrl-C sends SIGINT to the whole process group, and systemd's stop sends
    SIGTERM to every process of the service, pipeline worker processes included. Guards:
    each mp stage died of the signal, so the streams in flight failed with "pipeline worker
    rank 0 ... died" and the server exited with status 1 instead of draining them and
    exiting with 0."""
    # Popen'd children inherit an ignored SIGINT (a test run as a background job): make it
    # the default here, in this forked test process, as it is under a terminal.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = ["--device", "cpu", "--max-model-len", "256", "--pipeline-parallel-size", "2"]
    server = RemoteOpenAIServer(tiny_llama_dir, args + ["--shutdown-timeout", "300"])
    try:
        procs = _descendants(server)
        assert len(procs) == 2, [p.cmdline() for p in procs]
        streams = [_Stream(server, 60) for _ in range(2)]
        for s in streams:
            s.start()
        assert all(s.first.wait(120) for s in streams)
        os.killpg(server.proc.pid, sig)  # the server leads its own group
        assert server.proc.wait(320) == 0, server.log_tail()
        for s in streams:
            s.join(30)
            chunks = s.chunks()
            assert s.events[-1] == "[DONE]" and len(chunks) == 60, s.events[-3:]
            assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert "died" not in server.read_log(), server.log_tail()
        _assert_gone(procs)
    finally:
        server.stop()


class _Whole(threading.Thread):
    """One non-streamed 500-token completion; ``status`` and ``body`` of its answer."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.url = server.url_for("v1", "completions")
        self.status, self.body = None, None

    def run(self):
        body = {"prompt": "Once upon a time", "max_tokens": 500, "ignore_eos": True}
        r = httpx.post(self.url, json=body, timeout=600)
        self.status, self.body = r.status_code, r.json()


def _running(server) -> float:
    """vllm:num_requests_running from /metrics."""
    text = httpx.get(server.url_for("metrics"), timeout=30).text
    line = next(ln for ln in text.splitlines() if ln.startswith("vllm:num_requests_running{"))
    return float(line.rsplit(" ", 1)[1])


@pytest.mark.forked
def test_sigterm_aborts_what_outlives_shutdown_timeout(tiny_llama_dir):
    """--shutdown-timeout 0.5 against 500-token streams: each gets a final chunk with
    finish_reason "abort" and [DONE]; a non-streamed request cut short the same way gets a
    503 naming the shutdown (never a 200 with a partial or empty answer); the process exits
    0 within the timeout + 5 s."""
    args = ["--device", "cpu", "--max-model-len", "512", "--shutdown-timeout", "0.5"]
    server = RemoteOpenAIServer(tiny_llama_dir, args)
    try:
        procs = _descendants(server)
        whole = _Whole(server)
        whole.start()
        streams = [_Stream(server, 500) for _ in range(3)]
        for s in streams:
            s.start()
        assert all(s.first.wait(120) for s in streams)
        deadline = time.monotonic() + 60
        while _running(server) < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running(server) == 4
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0, server.log_tail()
        assert time.monotonic() - t0 < 0.5 + 5
        whole.join(30)
        assert whole.status == 503, (whole.status, whole.body)
        assert "shutting down" in whole.body["error"]["message"], whole.body
        _assert_aborted_cleanly(server, streams, procs, aborted=4)
    finally:
        server.stop()


@pytest.mark.forked
def test_second_sigint_aborts_running_streams_at_once(tiny_llama_dir):
    """SIGINT with a 300 s --shutdown-timeout waits (and says so); a second SIGINT aborts
    the 500-token streams now: each ends with finish_reason "abort" and [DONE], no
    traceback, exit status 0 long before the timeout."""
    args = ["--device", "cpu", "--max-model-len", "512", "--shutdown-timeout", "300"]
    server = RemoteOpenAIServer(tiny_llama_dir, args)
    try:
        procs = _descendants(server)
        streams = [_Stream(server, 500) for _ in range(3)]
        for s in streams:
            s.start()
        assert all(s.first.wait(120) for s in streams)
        server.proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + 60
        while "interrupt again" not in server.read_log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "for 3 request(s)" in server.read_log(), server.log_tail()
        assert server.proc.poll() is None  # still draining
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(60) == 0, server.log_tail()
        _assert_aborted_cleanly(server, streams, procs)
    finally:
        server.stop()
