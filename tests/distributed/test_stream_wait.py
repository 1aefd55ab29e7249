"""A streaming pipeline stage waits on its neighbour and on the executor's pipe at once
(vllm/worker/pp_stream.py ``CallSource.wait``): the worker's inbox keeps one byte per
queued message in a pipe (vllm/worker/worker_process.py ``_Inbox``), and a host channel
exposes the pipe that wakes its receiver (``communication.incoming_fd``)."""

import multiprocessing
import select

import torch

from vllm.distributed import communication as comm
from vllm.distributed.host_channel import HostChannel, pipeline_channels
from vllm.worker.pp_stream import CallSource
from vllm.worker.worker_process import FREE, STEP, _Inbox

CTX = multiprocessing.get_context("fork")


def _readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_inbox_pipe_is_readable_exactly_while_a_message_is_queued():
    inbox = _Inbox()
    assert not _readable(inbox.wait_fd)
    inbox.put((FREE, [1]))
    inbox.put((STEP, 7, "request"))
    assert _readable(inbox.wait_fd)
    assert inbox.get(False) == (FREE, [1])
    assert _readable(inbox.wait_fd)  # the step is still queued
    msg = inbox.get(False)
    assert msg == (STEP, 7, "request")
    assert not _readable(inbox.wait_fd)
    inbox.put_back(msg)  # taken once already: the stream is not woken for it again
    assert not _readable(inbox.wait_fd)
    assert inbox.get(False) == msg
    assert inbox.get(False) is None


def test_wait_tells_a_neighbour_message_from_an_executor_message():
    inbox = _Inbox()
    source = CallSource(lambda block: None, lambda tag, out: None, inbox.wait_fd)
    chans = pipeline_channels(CTX, 2, 1, 64)
    comm.install_host_channels(chans, 0)
    try:
        ids_fd = comm.incoming_fd(1, torch.device("cpu"))
        assert ids_fd == chans[(1, 0)].fileno()
        assert comm.incoming_fd(1, torch.device("cuda")) is None  # NCCL: never waited on
        assert comm.incoming_fd(0, torch.device("cpu")) is None  # no channel 0 -> 0

        inbox.put((STEP, 1, "call"))
        assert source.wait(ids_fd) is False  # only the executor's call: admit it first
        inbox.get(False)
        sender = HostChannel.__new__(HostChannel)  # rank 1's end: its own position
        sender.__dict__.update(chans[(1, 0)].__getstate__())
        sender.send(torch.tensor([3, 4]))
        assert source.wait(ids_fd) is True
        inbox.put((STEP, 2, "call"))
        assert source.wait(ids_fd) is True  # both: the neighbour's message first
        assert comm.recv_int_tensor(2, torch.device("cpu"), 1).tolist() == [3, 4]
        assert source.wait(ids_fd) is False
    finally:
        comm.install_host_channels({}, -1)
    assert CallSource(lambda b: None, lambda t, o: None).wait(ids_fd) is True  # no inbox fd
    assert source.wait(None) is True  # a neighbour without a channel: block in its recv
