"""Control path for token handover: eBPF sockmap redirect, with a user-space fallback
(InfScaler §IV-B, "eBPF-based event-driven sharing").

Not built yet: see the tensor-sharing issue.
"""
