"""The security rules as functions (infscaler.base.security): the function allow-list checks a
module before importing it, plan partition files stay inside, permission classes,
redaction of paths, and no privilege without credentials. The socket attacked by an
unprivileged client process is in tests/integration/api/test_security.py."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest

from infscaler.base.config import load_pipeline
from infscaler.base.security import (
    FunctionNotAllowedError,
    Peer,
    PermissionDeniedError,
    SecurityPolicy,
    may_read_write,
    redact,
)
from infscaler.runtime.serving.pipeline import load_function
from tests.integration.api.test_security import _model_pipeline


def test_load_function_checks_the_module_before_importing_it(tmp_path: Path, monkeypatch) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "evil_mod.py").write_text(
        f"open({str(marker)!r}, 'w').close()\ndef f(t):\n    return t\n"
    )
    (tmp_path / "reexport_mod.py").write_text("from os.path import join\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FunctionNotAllowedError, match="not allowed"):
        load_function("evil_mod:f", ("infscaler.pipelines",))
    assert not marker.exists()
    # plain-function rule: builtins, classes and names imported from elsewhere
    with pytest.raises(FunctionNotAllowedError, match="builtin_function_or_method"):
        load_function("os:system", ("os",))
    with pytest.raises(FunctionNotAllowedError, match="a class"):
        load_function("subprocess:Popen", ("subprocess",))
    with pytest.raises(FunctionNotAllowedError, match="defined in 'posixpath'"):
        load_function("reexport_mod:join", ("reexport_mod",))
    fn = load_function("infscaler.pipelines.ocr:det_preprocess", ("infscaler.pipelines",))
    assert fn.__name__ == "det_preprocess"
    # a module named like an allowed one but outside it
    with pytest.raises(FunctionNotAllowedError):
        load_function("infscaler.pipelinesX:f", ("infscaler.pipelines",))


# -- model repositories --------------------------------------------------------------------


def test_plan_partition_files_must_stay_inside(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    plan = repo / "plan"
    plan.mkdir(parents=True)
    (plan / "plan.yaml").write_text("partitions:\n  - {file: ../../secret.onnx}\n")
    policy = SecurityPolicy.create(model_repositories=[repo])
    cfg = load_pipeline(_model_pipeline(plan=str(plan)) | {"name": "p"})
    with pytest.raises(PermissionDeniedError, match="partition file"):
        policy.check_pipeline(cfg)
    # bundled aliases and the bundled pipelines are always allowed, with no repository
    from infscaler.cli.client import pipeline_from_arg

    for bundled in ("ocr", "dddd", "resnet50", "ppocrv4-det"):
        SecurityPolicy.create().check_pipeline(pipeline_from_arg(bundled))


def test_may_read_write_follows_the_permission_classes() -> None:
    def st(uid: int, gid: int, mode: int) -> os.stat_result:
        return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))

    me = Peer(1, 1000, 1000, frozenset({1000, 4242}))
    assert may_read_write(st(1000, 0, 0o600), me)
    assert not may_read_write(st(1000, 4242, 0o066), me)  # the owner class decides
    assert may_read_write(st(0, 4242, 0o660), me)  # via a supplementary group
    assert not may_read_write(st(0, 4242, 0o640), me)  # group may only read
    assert not may_read_write(st(0, 0, 0o600), me)
    assert may_read_write(st(0, 0, 0o666), me)


def test_redact_drops_path_keys_and_paths_in_messages() -> None:
    status = {
        "control_path": {"kind": "userspace", "reason": "no CAP_BPF; /var/cache/x/tokenbus.bpf.o"},
        "pipelines": [
            {
                "name": "ocr",
                "plans": {"det": "/var/lib/infscaler/plans/det-1a2b"},
                "units": [{"instances": [{"error": "cannot read /etc/x.onnx: bad", "pid": 7}]}],
                "requests": {"latency": {"p99_ms": 12.5}},
                "decisions": [{"reason": "P99 31 ms > SLO 20 ms, 3.2 req/s"}],
            }
        ],
    }
    out = redact(status)
    assert out["control_path"] == {"kind": "userspace", "reason": "no CAP_BPF; <path>"}
    p = out["pipelines"][0]
    assert "plans" not in p and p["units"][0]["instances"][0] == {
        "error": "cannot read <path>: bad",
        "pid": 7,
    }
    assert p["requests"] == status["pipelines"][0]["requests"]
    assert p["decisions"] == status["pipelines"][0]["decisions"]  # no path, left alone


def test_a_request_without_credentials_is_never_privileged() -> None:
    """A client that hangs up before the check (transport gone), or any transport that
    is not a Unix socket, is nobody: not the in-process caller (None) that may do all."""
    from types import SimpleNamespace

    from infscaler.base.security import peer_of, require_privileged

    gone = SimpleNamespace(transport=None)
    tcp_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        tcp = SimpleNamespace(transport=SimpleNamespace(get_extra_info=lambda _k: tcp_sock))
        for request in (gone, tcp):
            peer = peer_of(request)
            assert peer is not None and peer.uid == -1 and not peer.privileged
            with pytest.raises(PermissionDeniedError, match="reserved"):
                require_privileged(peer, "loading a model")
    finally:
        tcp_sock.close()
    # a connection's peer, read once when it was made, is every request's on it; a
    # request whose connection is gone is still nobody
    a, b = socket.socketpair(socket.AF_UNIX)
    try:
        from infscaler.base.security import peer_of_socket

        known = peer_of_socket(a)
        assert known.uid == os.getuid() and known.pid == os.getpid()

        def no_syscalls(_key: str) -> None:
            raise AssertionError("the socket was asked again")

        live = SimpleNamespace(
            transport=SimpleNamespace(get_extra_info=no_syscalls),
            protocol=SimpleNamespace(edge_peer=known),
        )
        assert peer_of(live) is known
        assert peer_of(SimpleNamespace(transport=None, protocol=live.protocol)).uid == -1
        # a protocol without one (not the API server's): the socket is asked
        other = SimpleNamespace(
            transport=SimpleNamespace(get_extra_info=lambda _k: b), protocol=object()
        )
        assert peer_of(other) == known
    finally:
        a.close()
        b.close()
    with pytest.raises(PermissionDeniedError, match="NUL byte"):
        SecurityPolicy.create().check_pipeline(
            load_pipeline(
                {
                    "name": "n",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
                    "outputs": ["y"],
                    "stages": [
                        {
                            "name": "s",
                            "function": "infscaler.pipelines.ocr:decode_line",
                            "params": {"rec_model": "a/\0b"},
                            "inputs": ["x"],
                            "outputs": ["y"],
                        }
                    ],
                }
            )
        )
