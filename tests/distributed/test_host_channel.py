"""The shared-memory host channel between pipeline stages (vllm/distributed/host_channel.py)
and its use by vllm/distributed/communication.py, without any process group: a message
that took gloo instead would fail for want of one."""

import multiprocessing
import threading
import time

import pytest
import torch

from vllm.distributed import communication as comm
from vllm.distributed.host_channel import (
    MAX_RING_BYTES,
    MIN_RING_BYTES,
    HostChannel,
    pipeline_channels,
    ring_bytes,
)

CTX = multiprocessing.get_context("fork")


def _messages() -> list[torch.Tensor]:
    """Messages of several dtypes and sizes whose bytes cross the ring's end repeatedly
    (a 1 KiB ring carries up to 512 bytes)."""
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(40):
        n = 1 + (i * 37) % 64
        if i % 3 == 0:
            out.append(torch.randint(-(2**40), 2**40, (n // 2 + 1,), generator=gen))
        elif i % 3 == 1:
            out.append(torch.randn(n, generator=gen))
        else:
            out.append(torch.randn(2, n // 2 + 1, generator=gen).to(torch.bfloat16))
    return out


def _other_end(chan: HostChannel) -> HostChannel:
    """The same channel as a second process would hold it (its own position): here both
    ends live in one process, each end keeps its own stream position."""
    end = HostChannel.__new__(HostChannel)
    end.__dict__.update(chan.__getstate__())
    end._pos = 0
    return end


def test_ring_size_and_limits():
    assert ring_bytes(100) == MIN_RING_BYTES
    assert ring_bytes(1 << 20) == 4 << 20
    assert ring_bytes(1 << 30) == MAX_RING_BYTES
    chan = HostChannel(CTX, 1024)
    assert chan.max_message == 512
    assert chan.carries(512) and not chan.carries(513) and not chan.carries(0)
    with pytest.raises(ValueError, match="513-byte message exceeds this channel's 512"):
        chan.send(torch.zeros(513, dtype=torch.uint8))


def test_messages_arrive_in_order_across_the_ring_end():
    chan = HostChannel(CTX, 1024)
    reader = _other_end(chan)
    sent = _messages()
    for i in range(0, len(sent), 2):  # two in flight at a time (at most 2 x 256 bytes)
        for msg in sent[i : i + 2]:
            chan.send(msg)
        for msg in sent[i : i + 2]:
            assert torch.equal(reader.recv_into(torch.empty_like(msg)), msg)
    assert reader._pos == chan._pos > 4 * chan.capacity  # round the ring several times


def test_other_process_receives_every_message_exactly():
    chan = HostChannel(CTX, 1024)
    sent = _messages()
    result = CTX.Queue()

    def receive():
        ok = [torch.equal(chan.recv_into(torch.empty_like(m)), m) for m in sent]
        result.put(ok)

    proc = CTX.Process(target=receive)
    proc.start()
    for msg in sent:  # the receiver frees space as it goes; the sender never outruns it
        chan.send(msg)
    assert result.get(timeout=60) == [True] * len(sent)
    proc.join(timeout=60)
    assert proc.exitcode == 0


def test_full_ring_makes_the_sender_wait_for_the_receiver():
    chan = HostChannel(CTX, 1024)
    msg = torch.arange(64, dtype=torch.int32)  # 256 bytes: four fill the ring
    for _ in range(4):
        chan.send(msg)
    done = threading.Event()

    def fifth():
        chan.send(msg + 1)
        done.set()

    sender = threading.Thread(target=fifth)
    sender.start()
    time.sleep(0.2)
    assert not done.is_set()  # no space until a message is consumed
    reader = _other_end(chan)
    assert torch.equal(reader.recv_into(torch.empty_like(msg)), msg)
    sender.join(timeout=10)
    assert done.is_set()
    for expect in (msg, msg, msg, msg + 1):
        assert torch.equal(reader.recv_into(torch.empty_like(msg)), expect)


def test_pipeline_channels_pair_the_stages():
    chans = pipeline_channels(CTX, 4, 1, 1000)
    assert sorted(chans) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    with_tp = pipeline_channels(CTX, 4, 2, 1000)  # ranks 0, 1 | 2, 3
    assert sorted(with_tp) == [(0, 2), (1, 3), (2, 0)]
    assert pipeline_channels(CTX, 2, 2, 1000) == {}  # TP alone: no stages


def test_communication_uses_installed_channels_without_a_process_group():
    """Rank 0 sends a plan header and hidden states to rank 1, which sends ids back: the
    calls of a pipeline stage, with channels installed and no process group."""
    chans = pipeline_channels(CTX, 2, 1, 2 * 4 * 8 * 4)
    hidden = torch.randn(4, 8)
    result = CTX.Queue()

    def stage1():
        comm.install_host_channels(chans, 1)
        head = comm.recv_header(3, 0)
        inter = comm.recv_intermediate_tensors(4, 8, torch.float32, torch.device("cpu"), 0)
        comm.send_int_tensor(torch.tensor([5, 6, 7, 8]), 0)
        result.put((head, torch.equal(inter["hidden_states"], hidden),
                    torch.equal(inter["residual"], hidden * 2)))  # fmt: skip

    proc = CTX.Process(target=stage1)
    proc.start()
    try:
        comm.install_host_channels(chans, 0)
        comm.send_header([1, 2, 3], 1)
        comm.send_intermediate_tensors(
            comm.IntermediateTensors({"hidden_states": hidden, "residual": hidden * 2}), 1
        )
        ids = comm.recv_int_tensor(4, torch.device("cpu"), 1)
        assert ids.tolist() == [5, 6, 7, 8]
        assert result.get(timeout=60) == ([1, 2, 3], True, True)
    finally:
        comm.install_host_channels({}, -1)
        proc.join(timeout=60)
    assert proc.exitcode == 0
