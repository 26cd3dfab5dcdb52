"""The CLI loads a command's module only when the command runs (infscaler.cli.COMMANDS):
``infscaler --help`` lists every command from the table, the table's lines are the
commands' own help, and importing the CLI loads none of the heavy dependencies."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from infscaler.cli import COMMANDS, app, load_command


def test_the_table_is_each_commands_own_help() -> None:
    for name, (_module, line) in COMMANDS.items():
        cmd = load_command(name)
        assert cmd is not None, name
        first = " ".join((cmd.help or "").split("\n\n")[0].split())
        assert line == first, f"{name}: COMMANDS says {line!r}, the command {first!r}"


def test_help_lists_every_command() -> None:
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0, res.output
    for name in COMMANDS:
        assert name in res.output, name


def test_importing_the_cli_is_cheap() -> None:
    heavy = ["aiohttp", "httpx", "onnx", "onnxruntime", "pydantic", "matplotlib", "tensorrt"]
    code = (
        "import sys, infscaler.cli; "
        f"print([m for m in {heavy!r} if m in sys.modules]); "
        "print(sorted(m for m in sys.modules if m.startswith('infscaler')))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, ours = res.stdout.splitlines()
    assert loaded == "[]", loaded
    assert ours == str(["infscaler", "infscaler.base", "infscaler.base.errors", "infscaler.cli"])
