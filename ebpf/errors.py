"""Errors of the control path (all :class:`~infscaler.base.errors.InfScalerError`)."""

from __future__ import annotations

from infscaler.base.errors import InfScalerError


class ChannelError(InfScalerError):
    """The control channel cannot do what was asked (unknown instance, bad token, ...)."""


class ChannelClosed(ChannelError):
    """The other side of an endpoint is gone (instance removed, channel closed, EOF)."""


class EbpfUnavailableError(ChannelError):
    """The eBPF channel cannot run on this host: the message says why (privilege,
    kernel, libbpf, clang); ``open_channel('auto')`` falls back to user space instead."""


class BpfBuildError(EbpfUnavailableError):
    """``tokenbus.bpf.c`` could not be compiled (clang or libbpf-dev missing, compile error)."""
