"""The service's security boundary: who may do what on its Unix socket.

Sources: ``unix(7)`` (SO_PEERCRED, SO_PEERGROUPS), ``credentials(7)``,
``path_resolution(7)``, ``inode(7)``; Triton ``extension_model_repository.md`` and
``extension_shared_memory.md``.

More: docs/security.md, "`infscaler/base/security.py`".
"""

from __future__ import annotations

import array
import inspect
import os
import re
import socket
import stat
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infscaler.base.errors import InfScalerError
from infscaler.base.models import MODELS

__all__ = [
    "BUILTIN_FUNCTION_MODULES",
    "FunctionNotAllowedError",
    "Peer",
    "PermissionDeniedError",
    "SecurityPolicy",
    "check_function_module",
    "check_plain_function",
    "is_privileged",
    "is_privileged_uid",
    "quota_uid",
    "may_read_write",
    "peer_of",
    "peer_of_socket",
    "peer_uid",
    "redact",
    "require_privileged",
]

#: Modules whose functions any pipeline may name (the bundled pipelines' stages).
BUILTIN_FUNCTION_MODULES: tuple[str, ...] = ("infscaler.pipelines",)
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ALLOW_HINT = (
    "allow more with `infscaler serve --allow-functions PACKAGE` (repeatable) or "
    "INFSCALER_ALLOW_FUNCTIONS in /etc/infscaler/infscaler.env"
)
#: SO_PEERGROUPS (Linux >= 4.13, ``asm-generic/socket.h``); Python does not name it.
_SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)


class PermissionDeniedError(InfScalerError):
    """The peer may not do this (HTTP 403)."""

    status = 403


class FunctionNotAllowedError(PermissionDeniedError):
    """A function stage names a module the service's configuration does not allow, or
    something that is not a plain function defined in its module (HTTP 403)."""


# -- peers --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Peer:
    """The process on the other end of a Unix socket connection: ``pid`` / ``uid`` / ``gid``
    (``SO_PEERCRED``), supplementary ``groups``, and ``privileged`` (root or the service's uid).
    """

    pid: int
    uid: int
    gid: int
    groups: frozenset[int] = field(default_factory=frozenset)

    @property
    def privileged(self) -> bool:
        return is_privileged_uid(self.uid)

    def describe(self) -> str:
        return f"uid {self.uid}, gid {self.gid}"


def _peer_groups(sock: socket.socket, pid: int, uid: int, gid: int) -> frozenset[int]:
    size = 4 * 64
    for _ in range(6):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, _SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == 34 and size < 4 * 65536:  # ERANGE: more groups than room
                size *= 4
                continue
            break
        groups = array.array("I")
        groups.frombytes(raw[: len(raw) - len(raw) % 4])
        return frozenset(groups)
    try:  # kernels without SO_PEERGROUPS
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except OSError:
        pass
    try:  # /proc hidden (ProtectProc=invisible): the configured groups of the user
        import pwd

        return frozenset(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    except (KeyError, OSError):
        return frozenset()


_NOBODY = Peer(-1, -1, -1)


def peer_uid(sock: Any) -> int:
    """The peer's uid of a connected Unix socket (``SO_PEERCRED``), or -1 (another
    transport, no credentials, gone)."""
    if sock is None or sock.family != socket.AF_UNIX:
        return -1
    try:
        return struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]
    except OSError:
        return -1


def peer_of(request: Any) -> Peer:
    """The :class:`Peer` of an aiohttp request: its connection's ``edge_peer``, else
    :func:`peer_of_socket`; never privileged (uid -1) without kernel credentials.
    """
    transport = request.transport
    if transport is None:
        return _NOBODY
    known = getattr(getattr(request, "protocol", None), "edge_peer", None)
    if isinstance(known, Peer):
        return known
    return peer_of_socket(transport.get_extra_info("socket"))


def peer_of_socket(sock: Any) -> Peer:
    """The :class:`Peer` of a connected socket (``SO_PEERCRED``, ``SO_PEERGROUPS``);
    uid -1 (never privileged) for None, another transport or no credentials."""
    if sock is None:
        return _NOBODY
    if sock.family == socket.AF_UNIX:
        try:
            pid, uid, gid = struct.unpack(
                "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
            )
        except OSError:
            pid = uid = gid = -1
        if uid >= 0:
            return Peer(pid, uid, gid, _peer_groups(sock, pid, uid, gid))
    return _NOBODY  # not a Unix socket, or no credentials: nobody vouches for the client


def is_privileged(peer: Peer | None) -> bool:
    """None (an in-process caller, no socket) or a privileged peer."""
    return peer is None or peer.privileged


def quota_uid(peer: Peer | None) -> int | None:
    """The key a client's per-uid quotas count it under: its uid, or None for the
    service's own user, root and in-process callers (held to the service-wide limits
    only: :mod:`infscaler.base.quotas`)."""
    return None if is_privileged(peer) else peer.uid  # type: ignore[union-attr]


def is_privileged_uid(uid: int | None) -> bool:
    """None (in-process), root or the service's own (effective) uid."""
    return uid is None or uid == 0 or uid == os.geteuid()


def require_privileged(peer: Peer | None, what: str) -> None:
    """PermissionDeniedError (403, saying who may do ``what``) unless ``peer`` is privileged."""
    if is_privileged(peer):
        return
    assert peer is not None
    raise PermissionDeniedError(
        f"{what} is reserved to the service's own user (uid {os.geteuid()}) and root; "
        f"you are {peer.describe()}",
        hint="members of the socket's group may infer, read metadata and statistics, and "
        "register their own shared memory; ask the operator to deploy pipelines",
    )


def may_read_write(st: os.stat_result, peer: Peer) -> bool:
    """Whether ``peer`` could open a file with status ``st`` for reading and writing
    under the classic permission classes (``inode(7)``: owner, else group, else other;
    ACLs are not consulted, so this never grants more than the mode bits)."""
    if peer.uid == 0:
        return True
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid == peer.uid:
        need = stat.S_IRUSR | stat.S_IWUSR
    elif st.st_gid == peer.gid or st.st_gid in peer.groups:
        need = stat.S_IRGRP | stat.S_IWGRP
    else:
        need = stat.S_IROTH | stat.S_IWOTH
    return mode & need == need


# -- function stages ----------------------------------------------------------------------


def parse_modules(values: Iterable[str]) -> tuple[str, ...]:
    """Module names from ``--allow-functions`` / ``$INFSCALER_ALLOW_FUNCTIONS``, deduplicated.

    Raises:
        InfScalerError: a name that is not a dotted Python module name.
    """
    out: list[str] = []
    for v in values:
        for name in re.split(r"[\s,]+", v.strip()):
            if not name:
                continue
            if not _MODULE.match(name):
                raise InfScalerError(
                    f"--allow-functions {name!r} is not a Python module or package name",
                    hint="give a dotted name such as mycompany.preprocessing",
                )
            if name not in out:
                out.append(name)
    return tuple(out)


def check_function_module(spec: str, allowed: Sequence[str]) -> None:
    """FunctionNotAllowedError (403) unless ``spec``'s module is in ``allowed`` or inside one;
    checked before anything is imported.
    """
    module, _, attr = spec.partition(":")
    if not any(module == m or module.startswith(m + ".") for m in allowed):
        raise FunctionNotAllowedError(
            f"function {spec!r} is not allowed: this service runs function stages only "
            f"from the modules {', '.join(allowed)}",
            hint=_ALLOW_HINT,
        )
    if attr.startswith("_"):
        raise FunctionNotAllowedError(
            f"function {spec!r} is not allowed: {attr!r} is a private name of {module}"
        )


def check_plain_function(spec: str, module: Any, fn: Any) -> None:
    """FunctionNotAllowedError (403) unless the reference is a plain Python function defined in
    the module it names.
    """
    if not inspect.isfunction(fn):
        kind = "a class" if inspect.isclass(fn) else f"a {type(fn).__name__}"
        raise FunctionNotAllowedError(
            f"function {spec!r} is not allowed: it is {kind}, not a plain Python function",
            hint="name a function defined with `def` in the module itself",
        )
    if fn.__module__ != module.__name__:
        raise FunctionNotAllowedError(
            f"function {spec!r} is not allowed: it is defined in {fn.__module__!r}, not in "
            f"{module.__name__!r}",
            hint=f"name it where it is defined ({fn.__module__}:{fn.__name__}), if that "
            "module is allowed",
        )


# -- model repositories -------------------------------------------------------------------


def _looks_like_path(value: str) -> bool:
    return "/" in value or os.sep in value or os.path.lexists(value)


@dataclass(frozen=True)
class SecurityPolicy:
    """What API-loaded pipelines may use: ``function_modules`` (builtin plus the operator's) and
    ``model_repositories`` (real paths models, plans and path parameters must lie in).
    """

    function_modules: tuple[str, ...] = BUILTIN_FUNCTION_MODULES
    model_repositories: tuple[str, ...] = ()

    @classmethod
    def create(
        cls,
        allow_functions: Iterable[str] = (),
        model_repositories: Iterable[str | os.PathLike[str]] = (),
    ) -> SecurityPolicy:
        """A policy from the operator's settings; InfScalerError for a bad module or repository."""
        modules = parse_modules([*BUILTIN_FUNCTION_MODULES, *allow_functions])
        repos: list[str] = []
        for d in model_repositories:
            real = os.path.realpath(d)
            if not os.path.isdir(real):
                raise InfScalerError(
                    f"--model-repository {d} is not a directory",
                    hint="create it, or pass the directory your models and plans live in",
                )
            if real not in repos:
                repos.append(real)
        return cls(modules, tuple(repos))

    def _inside(self, value: str | os.PathLike[str], what: str) -> str:
        if "\0" in os.fspath(value):
            raise PermissionDeniedError(f"{what} {os.fspath(value)!r} contains a NUL byte")
        real = os.path.realpath(value)
        for repo in self.model_repositories:
            if real == repo or real.startswith(repo.rstrip(os.sep) + os.sep):
                return real
        where = (
            "the model repositories " + ", ".join(self.model_repositories)
            if self.model_repositories
            else "a model repository (none is configured)"
        )
        raise PermissionDeniedError(
            f"{what} {os.fspath(value)!r} is not inside {where}: pipelines loaded through "
            "the API may only use files from there (symbolic links are resolved first)",
            hint="put the model under a repository directory, use a bundled model alias "
            "(`infscaler models`), or add the directory with `infscaler serve "
            "--model-repository DIR` / INFSCALER_MODEL_REPOSITORIES",
        )

    def check_pipeline(self, cfg: Any) -> None:
        """Check an API-loaded pipeline before anything is read or imported.

        Raises:
            FunctionNotAllowedError / PermissionDeniedError: (403) the first offence, naming the stage.
        """

        for i, st in enumerate(cfg.stages):
            where = f"stages[{i}] ({st.name})"
            if st.function:
                try:
                    check_function_module(st.function, self.function_modules)
                except FunctionNotAllowedError as exc:
                    raise FunctionNotAllowedError(f"{where}: {exc.message}", exc.hint) from None
                for v in _strings(st.params):
                    if _looks_like_path(v):
                        self._inside(v, f"{where}: parameter value")
            if st.model and (st.model not in MODELS or os.path.lexists(st.model)):
                self._inside(st.model, f"{where}: model")
            if st.plan:
                plan_dir = self._inside(st.plan, f"{where}: plan directory")
                self._check_plan_files(Path(plan_dir), where)

    def _check_plan_files(self, plan_dir: Path, where: str) -> None:
        import yaml

        try:
            summary = yaml.safe_load((plan_dir / "plan.yaml").read_text())
        except (OSError, yaml.YAMLError):
            return  # compile reports a missing or bad plan
        parts = summary.get("partitions") if isinstance(summary, dict) else None
        for p in parts if isinstance(parts, list) else []:
            f = p.get("file") if isinstance(p, dict) else None
            if isinstance(f, str):
                self._inside(plan_dir / f, f"{where}: partition file")


def _strings(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)


# -- status -------------------------------------------------------------------------------

#: Status keys whose values are file paths (dropped for peers that are not privileged).
PATH_KEYS = frozenset({"plans", "plan", "path", "plan_dir", "state_dir", "cache_dir", "socket"})
_ABS_PATH = re.compile(r"(?<![\w.~-])/[^\s'\",;:()\[\]{}]+")


def redact(value: Any) -> Any:
    """``value`` (status JSON) without file paths: keys in :data:`PATH_KEYS` are
    dropped, absolute paths inside strings become ``<path>``."""
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items() if k not in PATH_KEYS}
    if isinstance(value, list):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _ABS_PATH.sub("<path>", value)
    return value
