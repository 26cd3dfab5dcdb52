"""Control path for token handover and token faults (InfScaler §IV-B): an eBPF sockmap
redirect of 32-byte tokens (:mod:`.sockmap`), with a user-space channel as fallback
(:mod:`.userspace`); :func:`open_channel` probes and picks one.
"""

from infscaler.ebpf.channel import (
    MAX_BATCH,
    MAX_HOPS,
    MAX_INSTANCE_ID,
    MAX_PER_HOP,
    MAX_TRACKED,
    POLICIES,
    Channel,
    Endpoint,
    frame_fields,
    pack_frame,
)
from infscaler.ebpf.errors import BpfBuildError, ChannelClosed, ChannelError, EbpfUnavailableError
from infscaler.ebpf.probe import ebpf_available, open_channel
from infscaler.ebpf.token import TOKEN_SIZE, Token, TokenError, TokenKind

__all__ = [
    "MAX_BATCH",
    "MAX_INSTANCE_ID",
    "MAX_PER_HOP",
    "MAX_HOPS",
    "MAX_TRACKED",
    "POLICIES",
    "TOKEN_SIZE",
    "BpfBuildError",
    "Channel",
    "ChannelClosed",
    "ChannelError",
    "EbpfUnavailableError",
    "Endpoint",
    "Token",
    "TokenError",
    "TokenKind",
    "ebpf_available",
    "frame_fields",
    "open_channel",
    "pack_frame",
]
