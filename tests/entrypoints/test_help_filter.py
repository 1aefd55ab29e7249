"""``--help=WHAT`` shows part of a command's help, as upstream's ``vllm serve --help=...``:
``listgroup``, one group (by its title or upstream's config class name), the flags whose
names contain a word, ``all``; a word that matches nothing is one ``error:`` line, exit 2.
(Every ``--help=WHAT`` used to be refused: "ignored explicit argument".)"""

import pytest

from vllm.entrypoints import cli
from vllm.utils import FlexibleArgumentParser


def _run(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_listgroup_names_every_group(capsys):
    code, out, _ = _run(["serve", "--help=listgroup"], capsys)
    assert code == 0
    assert "  cache options: The paged KV cache." in out.splitlines()
    assert "  server options: The HTTP server and its logs." in out.splitlines()
    assert "--max-num-seqs" not in out


@pytest.mark.parametrize("what", ["cache", "CacheConfig", "cache options", "cache-options"])
def test_one_group(what, capsys):
    code, out, _ = _run(["serve", f"--help={what}"], capsys)
    assert code == 0
    assert out.startswith("cache options:\n  The paged KV cache.")
    assert "--block-size BLOCK_SIZE" in out and "(default: 16)" in out
    assert "--max-num-seqs" not in out and "--port" not in out  # other groups' flags


def test_upstream_frontend_is_the_server_group(capsys):
    code, out, _ = _run(["serve", "--help=Frontend"], capsys)
    assert code == 0 and out.startswith("server options:") and "--port PORT" in out


@pytest.mark.parametrize("what", ["max-num-seqs", "max_num_seqs", "--max-num-seqs"])
def test_one_flag(what, capsys):
    code, out, _ = _run(["serve", f"--help={what}"], capsys)
    assert code == 0
    lines = [ln for ln in out.splitlines() if ln.strip().startswith("--")]
    assert lines == ["  --max-num-seqs MAX_NUM_SEQS"]
    assert "Most sequences in one step. (default: 256)" in out


def test_keyword_matches_every_flag_containing_it(capsys):
    code, out, _ = _run(["serve", "--help=chat-template"], capsys)
    flags = [ln.split()[0] for ln in out.splitlines() if ln.strip().startswith("--")]
    assert code == 0 and out.startswith("flags matching 'chat-template':")
    assert flags == ["--chat-template", "--chat-template-content-format",
                     "--trust-request-chat-template", "--default-chat-template-kwargs"]  # fmt: skip


def test_all_is_the_whole_help(capsys):
    code, full, _ = _run(["serve", "--help"], capsys)
    code_all, out, _ = _run(["serve", "--help=all"], capsys)
    assert code == code_all == 0 and out == full


def test_no_match_is_one_error_line(capsys):
    code, out, err = _run(["serve", "--help=zzz"], capsys)
    assert code == 2 and out == ""
    assert err == (
        "error: --help=zzz matches no argument group or flag; --help=listgroup lists the "
        "groups (see `vllm serve --help`)\n"
    )


def test_run_batch_and_bench_scripts(capsys):
    code, out, _ = _run(["run-batch", "--help=scheduler"], capsys)
    assert code == 0 and out.startswith("scheduler options:") and "--max-num-seqs" in out
    code, out, _ = _run(["bench", "latency", "--help=num-iters"], capsys)
    assert code == 0 and "--num-iters" in out and "--max-num-seqs" not in out


def test_a_plain_flexible_parser():
    p = FlexibleArgumentParser(prog="tool")
    p.add_argument("--foo-bar", default=3, help="Foo.")
    with pytest.raises(SystemExit) as exc:
        p.parse_args(["--help=foo_bar"])
    assert exc.value.code == 0


def test_a_short_flag_finds_its_flag(capsys):
    code, out, _ = _run(["serve", "--help=-tp"], capsys)
    assert code == 0 and "--tensor-parallel-size TENSOR_PARALLEL_SIZE, -tp" in out
