"""Child processes import the package their parent imported, whatever the working
directory holds (issue 14: a wheel install served from the repository root, where
``./infscaler`` shadowed the installed package under ``python -m``)."""

from __future__ import annotations

import subprocess
import sys

from infscaler.base.procutil import module_command


def _shadowing_dir(tmp_path):
    fake = tmp_path / "infscaler"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise SystemExit(3)\n")
    return tmp_path


def test_python_dash_m_is_shadowed_by_the_working_directory(tmp_path):
    # the failure mode module_command exists for: -m imports ./infscaler first
    res = subprocess.run(
        [sys.executable, "-m", "infscaler.base.procutil"], cwd=_shadowing_dir(tmp_path), timeout=60
    )
    assert res.returncode == 3


def test_module_command_ignores_the_working_directory(tmp_path):
    code = "import infscaler, sys; print(infscaler.__file__); print(sys.argv[1:])"
    mod = tmp_path / "probe_mod.py"
    mod.write_text(code)
    (tmp_path / "cwd").mkdir()
    cwd = _shadowing_dir(tmp_path / "cwd")
    res = subprocess.run(
        module_command("probe_mod", "a", "b"),
        cwd=cwd,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    first, args = res.stdout.splitlines()
    assert not first.startswith(str(cwd / "infscaler"))
    assert args == "['a', 'b']"
