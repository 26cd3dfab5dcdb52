"""Control path for token handover and token faults (InfScaler §IV-B, "eBPF-based
event-driven sharing"): an eBPF sockmap redirect of 32-byte tokens, with a user-space
channel as fallback.

- :mod:`.token` -- the 32-byte :class:`Token` (the wire format the SK_MSG program parses).
- :func:`open_channel` (:mod:`.probe`) -- probe, then the eBPF channel or the user-space
  one (one log line saying why); :func:`ebpf_available` -- the probe alone.
- :class:`Channel` -- the manager side: add / remove instances, manager traffic, stats.
- :class:`Endpoint` -- an instance's side of its connection (any process).
- ``tokenbus.bpf.c`` -- the SK_MSG program; :mod:`.build` compiles it, :mod:`.libbpf`
  loads it; :mod:`.sockmap` and :mod:`.userspace` are the two channels (driven under
  load by producer / consumer processes in ``tests/channelload.py``).
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
