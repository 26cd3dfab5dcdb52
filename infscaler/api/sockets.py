"""The service's Unix sockets: a path made ready (a stale socket removed, a live one or
a non-socket refused), the group resolved, and the socket bound with its mode and group
final before the path appears (the HTTP socket, :mod:`infscaler.api.server`, and its
gRPC twin, :mod:`infscaler.api.grpc`, both bind through here).
"""

from __future__ import annotations

import contextlib
import grp
import os
import socket
import stat
import tempfile
from pathlib import Path

from infscaler.base.errors import InfScalerError

__all__ = ["bind_unix_socket", "prepare_socket_path", "resolve_group"]


def prepare_socket_path(path: str | os.PathLike[str]) -> Path:
    """Make ``path`` usable for a new server: create its directory, remove a stale
    socket left by a dead server.

    Raises:
        InfScalerError: another server answers on it, or the path is not a socket.
    """
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if p.exists() or p.is_symlink():
        if not stat.S_ISSOCK(p.lstat().st_mode):
            raise InfScalerError(f"{p} exists and is not a socket", hint="choose another --socket")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(p))
        except OSError:
            p.unlink()  # stale: nobody listens
        else:
            raise InfScalerError(
                f"another InfScaler service is listening on {p}",
                hint="stop it first, or pass a different --socket",
            )
        finally:
            s.close()
    return p


def resolve_group(group: str | int) -> int:
    """A group name or number as a gid.

    Raises:
        InfScalerError: no such group.
    """
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise InfScalerError(
            f"--socket-group {group!r}: no such group", hint="give a group name or a gid"
        ) from None


def bind_unix_socket(
    path: str | os.PathLike[str], mode: int = 0o660, group: str | int | None = None
) -> socket.socket:
    """A listening Unix stream socket at ``path`` whose mode (and group) are final before
    anyone can reach it: bound inside a fresh private (0700) directory next to ``path``,
    chmod-ed, chown-ed to ``group`` if given, then renamed into place (``rename(2)`` is
    atomic). Nothing touches the process-wide umask, so other threads are unaffected.

    Raises:
        InfScalerError: the group cannot be set (not root and not a member), or the
            path is too long for a Unix socket.
    """
    p = Path(path)
    gid = None if group is None else resolve_group(group)
    tmp_dir = tempfile.mkdtemp(prefix=".isc", dir=p.parent)  # mode 0700
    tmp = os.path.join(tmp_dir, "s")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            sock.bind(tmp)
        except OSError as exc:
            raise InfScalerError(
                f"cannot create the socket next to {p}: {exc}",
                hint="use a shorter --socket path (a Unix socket path has at most 107 bytes)",
            ) from None
        sock.listen(128)  # accept as soon as the path appears (the site listens again)
        os.chmod(tmp, mode)
        if gid is not None:
            try:
                os.chown(tmp, -1, gid)
            except PermissionError:
                raise InfScalerError(
                    f"cannot give the socket to group {group} (gid {gid}): permission denied",
                    hint="run the service as root or as a member of that group",
                ) from None
        os.rename(tmp, p)
    except BaseException:
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(tmp_dir)
    return sock
