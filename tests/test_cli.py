"""The command line's contract for bad input: one line on stderr, exit 2."""

from conftest import run_hwtrace


def test_unknown_option_is_one_line_exit_2():
    r = run_hwtrace("--no-such-option")
    assert r.returncode == 2
    assert r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.stderr


def test_unknown_command_is_one_line_exit_2():
    r = run_hwtrace("frobnicate")
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1


def test_version():
    r = run_hwtrace("--version")
    assert r.returncode == 0
    assert r.stdout.startswith("hwtrace ")
