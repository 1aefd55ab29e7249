"""BlockSpaceManager: block tables, free-list order, watermark and lookahead slots (CPU)."""

import ast
import itertools
import pathlib
import subprocess
import sys

import pytest

from vllm.core.block_manager import AllocStatus, BlockSpaceManager
from vllm.sampling_params import SamplingParams
from vllm.sequence import Logprob, Sequence, SequenceGroup, SequenceStatus

REPO = pathlib.Path(__file__).resolve().parents[2]
_ids = itertools.count()


def make_group(prompt_len: int, block_size: int, n: int = 1, rid: str = "r") -> SequenceGroup:
    seqs = [
        Sequence(next(_ids), None, list(range(1, prompt_len + 1)), block_size) for _ in range(n)
    ]
    return SequenceGroup(rid, seqs, SamplingParams(n=n, temperature=0.0))


def append_token(seq: Sequence, token: int = 7) -> None:
    seq.append_token_id(token, {token: Logprob(0.0)})


def test_allocate_covers_ceil_len_over_block_size_lowest_blocks_first():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=8, watermark=0.0)
    g1, g2 = make_group(5, 4), make_group(8, 4)
    bm.allocate(g1)
    bm.allocate(g2)
    assert bm.get_block_table(g1.seqs[0]) == [0, 1]  # ceil(5/4) = 2
    assert bm.get_block_table(g2.seqs[0]) == [2, 3]  # ceil(8/4) = 2
    assert bm.get_num_free_gpu_blocks() == 4
    assert bm.get_num_total_gpu_blocks() == 8
    assert bm.usage() == pytest.approx(0.5)
    bm.free(g1.seqs[0])
    assert not bm.has_table(g1.seqs[0])
    g3 = make_group(12, 4)
    bm.allocate(g3)  # reuses the freed low blocks first, then the next ones
    assert bm.get_block_table(g3.seqs[0]) == [0, 1, 4]


def test_allocator_can_be_steered_onto_the_last_block_never_past_it():
    bm = BlockSpaceManager(block_size=2, num_gpu_blocks=5, watermark=0.0)
    filler = make_group(8, 2)  # blocks 0..3
    bm.allocate(filler)
    last = make_group(1, 2)
    bm.allocate(last)
    assert bm.get_block_table(last.seqs[0]) == [4]  # num_gpu_blocks - 1; scratch 5 never used
    assert bm.get_num_free_gpu_blocks() == 0
    assert bm.can_allocate(make_group(1, 2)) == AllocStatus.LATER
    with pytest.raises(RuntimeError, match="need 1, 0 free of 5"):
        bm.allocate(make_group(1, 2))


def test_append_slots_grows_for_last_token_and_lookahead():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=10, watermark=0.0)
    g = make_group(8, 4)
    seq = g.seqs[0]
    seq.status = SequenceStatus.WAITING
    bm.allocate(g)
    seq.status = SequenceStatus.RUNNING
    assert len(bm.get_block_table(seq)) == 2
    bm.append_slots(seq, 0)  # len 8 is covered already
    assert len(bm.get_block_table(seq)) == 2
    append_token(seq)  # len 9: position 8 is written this step
    assert bm.can_append_slots(g, 0)
    bm.append_slots(seq, 0)
    assert bm.get_block_table(seq) == [0, 1, 2]
    bm.append_slots(seq, 4)  # 9 + 4 = 13 slots -> 4 blocks
    assert bm.get_block_table(seq) == [0, 1, 2, 3]
    bm.append_slots(seq, 3)  # 12 slots: tables never shrink
    assert len(bm.get_block_table(seq)) == 4
    assert bm.get_num_free_gpu_blocks() == 6
    bm.free(seq)
    assert bm.get_num_free_gpu_blocks() == 10


def test_can_append_slots_counts_every_running_seq():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=5, watermark=0.0)
    g = make_group(4, 4, n=2)
    bm.allocate(g)
    for s in g.seqs:
        s.status = SequenceStatus.RUNNING
    assert bm.get_num_free_gpu_blocks() == 3
    assert bm.can_append_slots(g, 4)  # each seq needs 1 more block: 2 <= 3
    assert not bm.can_append_slots(g, 5)  # 9 slots -> 3 blocks, 2 more each: 4 > 3
    g.seqs[1].status = SequenceStatus.FINISHED_STOPPED  # only RUNNING seqs grow
    assert bm.can_append_slots(g, 5)  # 2 <= 3


def test_can_allocate_ok_later_never_with_watermark():
    bm = BlockSpaceManager(block_size=1, num_gpu_blocks=200, watermark=0.01)
    assert bm.watermark_blocks == 2
    assert bm.can_allocate(make_group(198, 1)) == AllocStatus.OK
    assert bm.can_allocate(make_group(199, 1)) == AllocStatus.NEVER  # 200 - 199 < 2
    assert bm.can_allocate(make_group(201, 1)) == AllocStatus.NEVER
    bm.allocate(make_group(150, 1))
    assert bm.can_allocate(make_group(48, 1)) == AllocStatus.OK  # 50 - 48 = 2
    assert bm.can_allocate(make_group(49, 1)) == AllocStatus.LATER  # 50 - 49 < 2
    # n sequences need n tables' worth of blocks.
    assert bm.can_allocate(make_group(24, 1, n=2)) == AllocStatus.OK
    assert bm.can_allocate(make_group(25, 1, n=2)) == AllocStatus.LATER
    assert bm.can_allocate(make_group(100, 1, n=2)) == AllocStatus.NEVER


def test_n2_group_takes_two_separate_tables():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=8, watermark=0.0)
    g = make_group(6, 4, n=2)
    bm.allocate(g)
    t0, t1 = (bm.get_block_table(s) for s in g.seqs)
    assert t0 == [0, 1] and t1 == [2, 3]
    assert bm.get_num_free_gpu_blocks() == 4


def test_allocate_only_waiting_seqs_and_needs_unfinished():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=8, watermark=0.0)
    g = make_group(4, 4, n=2)
    g.seqs[1].status = SequenceStatus.FINISHED_ABORTED
    assert bm.can_allocate(g) == AllocStatus.OK
    bm.allocate(g)
    assert bm.has_table(g.seqs[0]) and not bm.has_table(g.seqs[1])
    assert bm.get_num_free_gpu_blocks() == 7


def test_double_free_and_double_allocate_raise():
    bm = BlockSpaceManager(block_size=4, num_gpu_blocks=8)
    g = make_group(4, 4)
    bm.allocate(g)
    with pytest.raises(ValueError, match="already has a block table"):
        bm.allocate(g)
    bm.free(g.seqs[0])
    with pytest.raises(KeyError, match="no block table"):
        bm.free(g.seqs[0])
    with pytest.raises(KeyError):
        bm.get_block_table(g.seqs[0])
    with pytest.raises(KeyError):
        bm.append_slots(g.seqs[0], 0)
    assert bm.get_num_free_gpu_blocks() == 8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_size=0, num_gpu_blocks=4), "block_size must be at least 1, got 0"),
        (dict(block_size=4, num_gpu_blocks=0), "num_gpu_blocks must be at least 1, got 0"),
        (dict(block_size=4, num_gpu_blocks=4, watermark=1.0), r"watermark must be in \[0, 1\)"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        BlockSpaceManager(**kwargs)


def test_core_never_imports_torch():
    code = "import sys, vllm.core; assert 'torch' not in sys.modules, 'vllm.core imported torch'"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    # And no module of vllm/core names torch in an import statement (even a lazy one).
    for path in (REPO / "vllm" / "core").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            assert not any(n.split(".")[0] == "torch" for n in names), path
