"""How the service starts its own Python children independent of the working directory
(``-m`` would put it first on ``sys.path`` and a checkout could shadow the installed
package), and whether a process has CUDA mapped (the zygote's fork-safety check).
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
    """``[sys.executable, "-c", BOOT, *args]``: runs ``module`` as ``__main__`` (``runpy``) with the
    working directory left off ``sys.path``.
    """
    return [sys.executable, "-c", _BOOT.format(module=module), *args]


#: file names of the CUDA driver, the CUDA runtime and TensorRT (a process that mapped any
#: of them may hold a CUDA context, which does not survive ``fork()``)
_CUDA_LIB = re.compile(r"^(libcuda|libcudart|libnvinfer)\.so(\.|$)")


def cuda_libraries_mapped(maps: str | None = None) -> list[str]:
    """Sorted paths of ``libcuda`` / ``libcudart`` / ``libnvinfer`` mapped in this process (from
    ``/proc/self/maps`` or the text ``maps``); [] when none or unreadable. The CUDA runtime is
    not fork-safe once initialised.
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
