"""docs/cli.md is what scripts/gen_cli_reference.py writes from the CLI itself: a changed
command, option, default or help text without the file regenerated fails here. One
process, no subprocess: the generator is imported and renders in-process."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests import REPO_ROOT

ROOT = REPO_ROOT
SCRIPT = ROOT / "scripts" / "gen_cli_reference.py"


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_cli_reference", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


def test_docs_cli_md_is_generated_from_the_cli(gen) -> None:
    committed = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert committed == gen.render(), (
        "docs/cli.md differs from what the CLI generates: run "
        "`.venv/bin/python scripts/gen_cli_reference.py` and commit docs/cli.md "
        "(`--check` shows the difference)"
    )


def test_every_command_has_a_section(gen) -> None:
    from infscaler.cli import COMMANDS

    text = gen.render()
    for name in COMMANDS:
        assert f"### `infscaler {name}`" in text, name
    assert "### `infscaler variants register`" in text


def test_the_text_does_not_depend_on_the_terminal(gen, monkeypatch) -> None:
    wide = gen.render()
    for columns in ("40", "250"):
        monkeypatch.setenv("COLUMNS", columns)
        monkeypatch.setenv("TERMINAL_WIDTH", columns)
        assert gen.render() == wide
    monkeypatch.setenv("NO_COLOR", "1")
    assert gen.render() == wide
