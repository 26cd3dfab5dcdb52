"""Probe the host and open the control channel at start-up: the eBPF one where it can run,
else the user-space fallback, with one log line saying why (shared/notes/ebpf.md).
"""

from __future__ import annotations

import errno
import logging

from infscaler.ebpf import build, libbpf
from infscaler.ebpf.channel import Channel, check_policy
from infscaler.ebpf.errors import ChannelError, EbpfUnavailableError
from infscaler.ebpf.sockmap import EbpfChannel
from infscaler.ebpf.userspace import UserspaceChannel

__all__ = ["ebpf_available", "open_channel"]

log = logging.getLogger("infscaler.ebpf")


def ebpf_available() -> tuple[bool, str]:
    """``(True, what was found)`` or ``(False, why not and what to do)``: a 1-entry SOCKMAP,
    libbpf.so.1 and the built BPF object.
    """
    try:
        libbpf.probe_sockmap()
    except libbpf.BpfError as exc:
        if exc.errno == errno.EPERM:
            try:
                with open("/proc/sys/kernel/unprivileged_bpf_disabled") as f:
                    sysctl = f" (kernel.unprivileged_bpf_disabled={f.read().strip()})"
            except OSError:
                sysctl = ""
            return False, (
                "no CAP_BPF + CAP_NET_ADMIN: creating a SOCKMAP failed with EPERM"
                f"{sysctl}; run the manager as root or grant it cap_bpf,cap_net_admin"
            )
        if exc.errno == errno.EINVAL:
            return False, "the kernel cannot create a SOCKMAP (EINVAL): no sockmap support"
        return False, f"bpf() probe failed: {exc}"
    try:
        version = libbpf.libbpf_version()
    except libbpf.BpfError as exc:
        return False, str(exc)
    try:
        path = build.build_object()
    except EbpfUnavailableError as exc:
        return False, str(exc)
    return True, f"SOCKMAP created; libbpf {version}; object {path}"


def open_channel(prefer: str = "auto", policy: str = "least-loaded") -> Channel:
    """Open the control channel.

    Args:
        prefer: ``'auto'`` (eBPF when available and loadable, else user space, one log line
            saying why), ``'ebpf'`` (raise if unavailable) or ``'userspace'``.
        policy: ``'least-loaded'`` or ``'round-robin'``.

    Raises:
        EbpfUnavailableError: ``prefer='ebpf'`` and the eBPF channel cannot run.
        ChannelError: unknown ``prefer`` or ``policy``.
    """
    check_policy(policy)
    if prefer not in ("auto", "ebpf", "userspace"):
        raise ChannelError(f"unknown channel preference {prefer!r}", hint="auto, ebpf or userspace")
    if prefer == "userspace":
        ch: Channel = UserspaceChannel(policy)
        ch.reason = "forced (prefer='userspace')"
        log.info("control channel: user-space AF_UNIX router (%s)", ch.reason)
        return ch
    ok, why = ebpf_available()
    if ok:
        try:
            ch = EbpfChannel(policy)
            ch.reason = why
            log.info("control channel: eBPF sockmap, %s routing (%s)", policy, why)
            return ch
        except EbpfUnavailableError as exc:
            ok, why = False, str(exc)
    if prefer == "ebpf":
        raise EbpfUnavailableError(f"eBPF control channel unavailable: {why}")
    ch = UserspaceChannel(policy)
    ch.reason = why
    one_line = " | ".join(ln.strip() for ln in why.splitlines() if ln.strip())
    log.warning(
        "control channel: eBPF unavailable, using the user-space AF_UNIX router: %s", one_line
    )
    return ch
