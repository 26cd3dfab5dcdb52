"""The Helm chart (deploy/helm/infscaler): rendered (with deploy/render.py, and with helm
when it is on PATH) and every manifest validated against the Kubernetes schemas of two
versions (kubernetes-validate, offline); bad values refused with a clear message; the
exec probes' exit codes."""

from __future__ import annotations

import http.server
import importlib.util
import shutil
import socketserver
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from tests import REPO_ROOT
from tests.unit.test_helm_chart import FLEET_VALUES

ROOT = REPO_ROOT
CHART = ROOT / "deploy" / "helm" / "infscaler"

_spec = importlib.util.spec_from_file_location("chart_render", ROOT / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"service": {"poolMb": "lots"}}, "service.poolMb: 'lots' is not of type 'integer'"),
        (
            {"groups": [{"name": "a", "nodeSelector": {"x": "y"}, "pipelines": ["nope"]}]},
            "groups[0].pipelines: ['nope'] are not in pipelines",
        ),
        ({"models": {"source": "pvc"}}, "models.pvc: '' should be non-empty"),
        ({"deviceOverride": "jetson-tx9"}, "groups[0].device: unknown device 'jetson-tx9'"),
        ({"groups": [{"name": "Bad_Name", "nodeSelector": {"x": "y"}}]}, "groups[0].name"),
        ({"ebpf": {"enabled": "yes"}}, "ebpf.enabled: 'yes' is not of type 'boolean'"),
        ({"replicas": 3}, "Additional properties are not allowed ('replicas' was unexpected)"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(
    tmp_path: Path, values: dict, message: str
) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(values))
    r = subprocess.run(
        [sys.executable, str(ROOT / "deploy" / "render.py"), str(CHART), "-f", str(f)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.startswith("error: the values are refused:")
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""


@pytest.mark.skipif(
    shutil.which("helm") is None,
    reason="no helm binary (Debian has none; deploy/render.py renders the chart instead)",
)
def test_helm_itself_agrees(tmp_path: Path) -> None:
    f = tmp_path / "v.yaml"
    f.write_text(yaml.safe_dump(FLEET_VALUES))
    subprocess.run(["helm", "lint", str(CHART), "-f", str(f)], check=True)
    out = subprocess.run(
        ["helm", "template", "infscaler", str(CHART), "-n", "infscaler", "-f", str(f)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    theirs = [d for d in yaml.safe_load_all(out) if d]
    ours = render.render_chart(CHART, render.load_values(CHART, [f]))
    assert theirs == ours


# -- the exec probes -----------------------------------------------------------------------


class _Health(http.server.BaseHTTPRequestHandler):
    ready = False

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        ok = self.path == "/v2/health/live" or (self.path == "/v2/health/ready" and self.ready)
        body = b'{"live": true}' if ok else b'{"error": "not ready: pipelines are not ready"}'
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


def _probe(what: str, sock: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "infscaler", "probe", what, "--socket", str(sock)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_probe_exit_codes(tmp_path: Path) -> None:
    sock = tmp_path / "h.sock"
    assert _probe("live", sock).returncode == 1  # nothing there
    srv = socketserver.UnixStreamServer(str(sock), _Health)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        assert _probe("live", sock).returncode == 0
        r = _probe("ready", sock)  # live but not ready (deploying or draining): 503
        assert r.returncode == 1 and "not ready" in r.stderr
        _Health.ready = True
        assert _probe("ready", sock).returncode == 0
    finally:
        _Health.ready = False
        srv.shutdown()
        srv.server_close()
