"""Compile ``tokenbus.bpf.c`` (``clang -O2 -g -target bpf``) into a cache keyed by content:
``<cache dir>/ebpf/tokenbus-<sha256>.bpf.o``; ``INFSCALER_BPF_OBJECT`` names a prebuilt one.
CLI: ``python -m infscaler.ebpf.build [--force]`` prints the object's path.

Sources: libbpf "Building BPF applications", clang BPF target docs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from infscaler.ebpf.errors import BpfBuildError

SOURCE = Path(__file__).with_name("tokenbus.bpf.c")

#: Compile-time limits, passed as -D to clang; :mod:`infscaler.ebpf.sockmap` mirrors them.
LIMITS = {"TB_MAX_STAGES": 64, "TB_PER_STAGE": 16, "TB_MAX_TRACKED": 65536}
CFLAGS = ["-O2", "-g", "-target", "bpf", "-Wall", "-Wno-unused-function"]
COMPILE_TIMEOUT_S = 120


def cache_dir() -> Path:
    """Directory for built objects (created on demand)."""
    base = os.environ.get("INFSCALER_CACHE_DIR")
    if base:
        return Path(base) / "ebpf"
    xdg = os.environ.get("XDG_CACHE_HOME")
    root = Path(xdg) if xdg else Path.home() / ".cache"
    return root / "infscaler" / "ebpf"


def _arch_include() -> str:
    machine = platform.machine()
    machine = {"arm64": "aarch64"}.get(machine, machine)
    return f"/usr/include/{machine}-linux-gnu"


def _flags() -> list[str]:
    return [*CFLAGS, f"-I{_arch_include()}", *(f"-D{k}={v}" for k, v in LIMITS.items())]


def object_path() -> Path:
    """Where the object for the current source and limits is (or will be) cached."""
    override = os.environ.get("INFSCALER_BPF_OBJECT")
    if override:
        return Path(override)
    try:
        source = SOURCE.read_bytes()
    except OSError as exc:
        raise BpfBuildError(
            f"the eBPF program source {SOURCE} cannot be read ({exc.strerror}): this "
            "installation lacks package data",
            hint="reinstall the infscaler wheel, or set INFSCALER_BPF_OBJECT to a prebuilt object",
        ) from None
    h = hashlib.sha256(source)
    h.update("\0".join(_flags()).encode())
    return cache_dir() / f"tokenbus-{h.hexdigest()[:16]}.bpf.o"


def build_object(force: bool = False) -> Path:
    """The compiled object's path, building it if missing (or if ``force``).

    Raises:
        BpfBuildError: no clang, ``INFSCALER_BPF_OBJECT`` points nowhere, or clang failed
            (its stderr tail).
    """
    path = object_path()
    if os.environ.get("INFSCALER_BPF_OBJECT"):
        if not path.is_file():
            raise BpfBuildError(f"INFSCALER_BPF_OBJECT={path} does not exist")
        return path
    if path.is_file() and not force:
        return path
    clang = shutil.which(os.environ.get("CLANG", "clang"))
    if clang is None:
        raise BpfBuildError(
            "clang not found: cannot build the eBPF object tokenbus.bpf.o",
            hint="apt-get install -y clang libbpf-dev, or set INFSCALER_BPF_OBJECT to a prebuilt object",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tokenbus-", suffix=".o", dir=path.parent)
    os.close(fd)
    try:
        cmd = [clang, *_flags(), "-c", str(SOURCE), "-o", tmp]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BpfBuildError(f"clang took more than {COMPILE_TIMEOUT_S} s") from None
        if res.returncode != 0:
            tail = "\n".join(res.stderr.strip().splitlines()[-8:])
            hint = None
            if "bpf_helpers.h" in res.stderr:
                hint = "apt-get install -y libbpf-dev"
            elif "asm/types.h" in res.stderr:
                hint = "apt-get install -y linux-libc-dev (kernel UAPI headers)"
            raise BpfBuildError(f"clang failed to build {SOURCE.name}:\n{tail}", hint=hint)
        os.replace(tmp, path)  # atomic: concurrent builders all end with a whole file
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Build the eBPF token router object.")
    ap.add_argument("--force", action="store_true", help="rebuild even if cached")
    args = ap.parse_args(argv)
    print(build_object(force=args.force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
