"""How the service starts its own Python child processes (instances, load generators,
variant builders), independent of the working directory; and whether a process has CUDA
mapped (:func:`cuda_libraries_mapped`: the zygote's fork-safety check).

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

import os
import re
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


#: file names of the CUDA driver, the CUDA runtime and TensorRT (a process that mapped any
#: of them may hold a CUDA context, which does not survive ``fork()``)
_CUDA_LIB = re.compile(r"^(libcuda|libcudart|libnvinfer)\.so(\.|$)")


def cuda_libraries_mapped(maps: str | None = None) -> list[str]:
    """The CUDA libraries (``libcuda``, ``libcudart``, ``libnvinfer``) mapped into this
    process: the paths, sorted, from ``/proc/self/maps`` (or the text ``maps``); [] when
    none is, or where ``/proc`` cannot be read.

    A forked child cannot use a CUDA context its parent created (CUDA C Programming
    Guide: the CUDA runtime is not fork-safe once initialised), so the zygote checks this
    before each fork (:mod:`infscaler.runtime.processes.zygote`).
    """
    if maps is None:
        try:
            with open(f"/proc/{os.getpid()}/maps") as f:
                maps = f.read()
        except OSError:
            return []
    found = set()
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6:
            path = parts[5].strip()
            if _CUDA_LIB.match(os.path.basename(path.removesuffix(" (deleted)"))):
                found.add(path)
    return sorted(found)
