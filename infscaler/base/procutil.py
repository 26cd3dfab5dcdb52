"""How the service starts its own Python child processes (instances, load generators,
variant builders), independent of the working directory.

``python -m pkg.mod`` puts the working directory first on ``sys.path``: started from a
checkout of this repository with the package installed from a wheel, ``./infscaler``
(whose subpackages live in other folders, mapped only by the installed package) shadows
the installed package and every child dies with ``No module named 'infscaler.runtime'``.
:func:`module_command` runs the module the way ``-m`` does (``runpy.run_module`` with
``run_name='__main__'``, Python docs: *runpy*) after dropping the working-directory
entry, so a child imports exactly what its parent imported. (Python 3.11's ``-P`` does
the same, but the package supports 3.10.)
"""

from __future__ import annotations

import sys

_BOOT = (
    "import sys, runpy; "
    "sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def module_command(module: str, *args: str) -> list[str]:
    """The argv that runs ``module`` as ``__main__`` with this interpreter, the working
    directory left off ``sys.path``.

    Args:
        module: a dotted module name, e.g. ``"infscaler.runtime.serving.instance"``.
        args: its command-line arguments (``sys.argv[1:]`` in the child).

    Returns:
        ``[sys.executable, "-c", BOOT, *args]``.
    """
    return [sys.executable, "-c", _BOOT.format(module=module), *args]
