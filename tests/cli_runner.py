"""Invoking the `modeconn` CLI in-process (typer's test runner) from tests."""

from __future__ import annotations

from typer.testing import CliRunner

from modeconn.cli import app

runner = CliRunner()


def run_cli(*args, ok=True):
    """Run ``modeconn ARGS``; with ``ok`` assert exit code 0 (showing the output otherwise)."""
    res = runner.invoke(app, [str(a) for a in args])
    if ok:
        assert res.exit_code == 0, res.output
    return res
