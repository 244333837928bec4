"""The small pieces the one-line contract rests on (issue 17): output checks, stage folders written whole,
JSON and TOML depth, gate's markdown escaping, and the worker record tune keeps per trial."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autospec.artifacts import check_output, output_problem, staged_dir, write_json
from autospec.errors import InputError, parse_json, parse_toml, read_text_file
from autospec.gate import md_escape


def test_output_problem_names_files_in_the_way_and_unwritable_places(tmp_path):
    (tmp_path / "file").write_text("x")
    assert output_problem(tmp_path / "new" / "deeper", directory=True) is None  # created later, not now
    assert not (tmp_path / "new").exists()
    assert output_problem(tmp_path / "file", directory=True) == "exists and is not a directory"
    assert "is not a directory" in output_problem(tmp_path / "file" / "below", directory=True)
    assert output_problem(tmp_path, directory=False) == "is a directory, not a file"
    assert "cannot write under /proc" in output_problem(Path("/proc/autospec-test/x"), directory=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the probe folder is gone
    with pytest.raises(InputError, match=r"\[out\]"):
        check_output(tmp_path / "file", directory=True)


def test_a_stage_folder_appears_whole_or_not_at_all(tmp_path):
    final = tmp_path / "eval"
    with staged_dir(final) as stage:
        write_json(stage / "a.json", {"n": 1})
        write_json(stage / "b.json", {"n": 1})
        assert not final.exists()  # nothing visible until the stage ends
    assert sorted(p.name for p in final.iterdir()) == ["a.json", "b.json"]
    with pytest.raises(RuntimeError):
        with staged_dir(final) as stage:
            write_json(stage / "a.json", {"n": 2})
            raise RuntimeError("the stage failed half way")
    assert (final / "a.json").read_text().count('"n": 1') == 1  # the earlier folder, untouched
    with staged_dir(final) as stage:
        write_json(stage / "a.json", {"n": 3})
    assert sorted(p.name for p in final.iterdir()) == ["a.json"]  # replaced as a whole: no stale b.json
    assert [p.name for p in tmp_path.iterdir()] == ["eval"]  # no staging or retired folder left


def test_a_killed_stage_leaves_the_earlier_folder_and_only_a_hidden_staging_folder(tmp_path):
    final = tmp_path / "eval"
    with staged_dir(final) as stage:
        write_json(stage / "summary.json", {"run": "first"})
    script = (f"import os\nfrom autospec.artifacts import staged_dir, write_json\n"
              f"with staged_dir({str(final)!r}) as stage:\n"
              f"    write_json(stage / 'requests.json', {{'run': 'second'}})\n"
              f"    os.kill(os.getpid(), 9)\n")
    res = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert res.returncode == -9
    assert [p.name for p in final.iterdir()] == ["summary.json"]
    assert all(p.name.startswith(".eval.staging-") for p in tmp_path.iterdir() if p.name != "eval")


def test_deep_nesting_is_an_input_error_not_a_recursion_error():
    with pytest.raises(InputError, match="nested too deeply"):
        parse_json("[" * 100_000 + "]" * 100_000, path="f.json")
    with pytest.raises(InputError, match="nested too deeply"):
        parse_toml("x = " + "[" * 5_000 + "]" * 5_000, path="f.toml")
    with pytest.raises(InputError, match=r"f.json:2: not valid JSON"):
        parse_json('{\n"a": }', path="f.json")
    assert parse_json('{"a": [1, {"b": null}]}') == {"a": [1, {"b": None}]}


def test_files_that_are_not_regular_files_are_refused(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InputError, match="not a regular file"):
        read_text_file(tmp_path / "pipe")  # returns at once: a pipe with no writer would block for ever
    with pytest.raises(InputError, match="is a directory"):
        read_text_file(tmp_path)
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(InputError, match=r"latin1.toml:1: file is not UTF-8"):
        read_text_file(tmp_path / "latin1.toml")


@pytest.mark.parametrize("name, shown", [
    ("a|b", r"a\|b"),
    ("<img src=x onerror=alert(1)>", "&lt;img src=x onerror=alert(1)&gt;"),
    ("**bold** [link](http://x) `code` ~~s~~ $x$", r"\*\*bold\*\* \[link\](http://x) \`code\` \~\~s\~\~ \$x\$"),
    ("line\nbreak", "line break"),
    ("tpot_mean static-k2", "tpot_mean static-k2"),  # an underscore inside a word is not emphasis
    ("_lead trail_", r"\_lead trail\_"),
])
def test_gate_markdown_escapes_what_users_named(name, shown):
    assert md_escape(name) == shown


def test_the_worker_record_tells_a_dead_local_process_from_a_live_or_remote_one():
    from autospec.tune import WORKER, _worker_alive

    host = socket.gethostname()
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    start = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    proc.wait()
    assert _worker_alive(WORKER, host) is True
    assert _worker_alive(f"{host}:{proc.pid}:{start}", host) is False
    assert _worker_alive(f"{host}:{os.getpid()}:1", host) is False  # the pid runs, but it is not that process
    assert _worker_alive(f"other-host:{proc.pid}:{start}", host) is None
    assert _worker_alive("not a record", host) is None
