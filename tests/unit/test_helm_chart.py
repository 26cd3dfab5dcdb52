"""The Helm chart (deploy/helm/infscaler): rendered (with deploy/render.py, and with helm
when it is on PATH) and every manifest validated against the Kubernetes schemas of two
versions (kubernetes-validate, offline); bad values refused with a clear message; the
exec probes' exit codes."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import yaml

from tests import REPO_ROOT

ROOT = REPO_ROOT
CHART = ROOT / "deploy" / "helm" / "infscaler"
K8S_VERSIONS = ("1.29.0", "1.33.0")

_spec = importlib.util.spec_from_file_location("chart_render", ROOT / "deploy" / "render.py")
render = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(render)

kv = pytest.importorskip("kubernetes_validate", reason="the dev extra installs kubernetes-validate")

PIPE = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
    "outputs": ["y"],
    "stages": [
        {"name": "det", "model": "/models/det.onnx", "inputs": {"x": "x"}, "outputs": {"y": "y"}}
    ],
}

FLEET_VALUES = {
    "image": {"repository": "registry.example/infscaler", "tag": "0.1.0"},
    "pipelines": {"det": PIPE, "ocr": dict(PIPE, slo="300ms")},
    "groups": [
        {
            "name": "g1-orin-agx",
            "device": "orin-agx",
            "nodeSelector": {"infscaler.io/group": "g1-orin-agx"},
            "pipelines": ["det", "ocr"],
        },
        {
            "name": "g2-orin-nano",
            "nodeSelector": {"infscaler.io/group": "g2-orin-nano"},
            "pipelines": ["det"],
        },
    ],
    "models": {"source": "pvc", "pvc": "models"},
    "service": {"drainTimeoutSeconds": 60, "poolMb": 1024},
}


def validate_all(docs: list[dict]) -> None:
    assert docs
    for version in K8S_VERSIONS:
        for d in docs:
            kv.validate(d, version, strict=True)  # raises with the field at fault


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_default_values_render_and_validate() -> None:
    docs = render.render_chart(CHART)
    validate_all(docs)
    ds = by_kind(docs, "DaemonSet")
    # one DaemonSet per device profile listed in values.yaml, one ConfigMap per group
    devices = yaml.safe_load((CHART / "values.yaml").read_text())["devices"]
    assert sorted(d["metadata"]["labels"]["infscaler.io/device"] for d in ds) == sorted(devices)
    assert len(by_kind(docs, "ConfigMap")) == 1


def test_daemonset_spec() -> None:
    values = render.load_values(CHART, overrides=FLEET_VALUES)
    docs = render.render_chart(CHART, values)
    validate_all(docs)
    ds = {d["metadata"]["name"]: d for d in by_kind(docs, "DaemonSet")}
    # group 1 is pinned to orin-agx: one DaemonSet; group 2 follows the labels: 5
    assert "infscaler-g1-orin-agx-orin-agx" in ds and len(ds) == 1 + 5
    agx = ds["infscaler-g1-orin-agx-orin-agx"]
    pod = agx["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["terminationGracePeriodSeconds"] == 60 + 15  # the drain + stopping instances
    assert "--drain-timeout=60" in c["args"] and "--device=orin-agx" in c["args"]
    assert "--watch-pipelines=/etc/infscaler/pipelines" in c["args"]
    assert agx["spec"]["updateStrategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # the socket on a hostPath, the same path inside
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["socket"]["hostPath"]["path"] == "/run/infscaler"
    assert {"name": "socket", "mountPath": "/run/infscaler"} in c["volumeMounts"]
    assert vols["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1088Mi"}
    assert vols["models"]["persistentVolumeClaim"]["claimName"] == "models"
    # exactly the eBPF path's capabilities, nothing else
    sc = c["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON"]}
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    # probes: the CLI over the socket
    assert c["livenessProbe"]["exec"]["command"] == ["infscaler", "probe", "live"]
    assert c["readinessProbe"]["exec"]["command"] == ["infscaler", "probe", "ready"]
    # requests from the device profile's cap
    assert c["resources"]["requests"] == {"memory": "49152Mi", "cpu": "6000m"}
    # an edit of the pipelines must not restart the pods: no checksum annotation; the
    # only annotations are Prometheus's scrape settings, for the metrics port it serves
    annotations = agx["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9464",
        "prometheus.io/path": "/metrics",
    }
    assert "--metrics-port=9464" in c["args"] and "--metrics-host=0.0.0.0" in c["args"]
    # the pipelines come through the repository API: the models mount is its repository
    assert "--model-repository=/models" in c["args"]
    # the pinned group selects by its label alone; the others by device label / GFD label
    terms = agx["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {
            "matchExpressions": [
                {"key": "infscaler.io/group", "operator": "In", "values": ["g1-orin-agx"]}
            ]
        }
    ]
    nano = ds["infscaler-g2-orin-nano-orin-nano"]["spec"]["template"]["spec"]
    terms = nano["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms[0]["matchExpressions"][0] == {
        "key": "infscaler.io/device",
        "operator": "In",
        "values": ["orin-nano"],
    }
    assert terms[1]["matchExpressions"][:2] == [
        {"key": "infscaler.io/device", "operator": "DoesNotExist"},
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-Jetson-Orin-Nano"]},
    ]
    # each group's ConfigMap holds its pipelines only, as pipeline files
    cms = {d["metadata"]["name"]: d["data"] for d in by_kind(docs, "ConfigMap")}
    assert sorted(k for k in cms["infscaler-g1-orin-agx-pipelines"] if k.endswith(".yaml")) == [
        "det.yaml",
        "ocr.yaml",
    ]
    assert sorted(k for k in cms["infscaler-g2-orin-nano-pipelines"] if k.endswith(".yaml")) == [
        "det.yaml"
    ]
    assert yaml.safe_load(cms["infscaler-g1-orin-agx-pipelines"]["ocr.yaml"])["slo"] == "300ms"


def test_ebpf_off_drops_every_capability_and_init_container_models() -> None:
    values = render.load_values(
        CHART,
        overrides={
            "ebpf": {"enabled": False},
            "deviceOverride": "orin-nx",
            "runtimeClassName": "",
            "models": {
                "source": "initContainer",
                "initContainer": {
                    "image": "busybox:1.36",
                    "command": ["sh", "-c", "cp -r /m /models"],
                },
            },
        },
    )
    docs = render.render_chart(CHART, values)
    validate_all(docs)
    (ds,) = by_kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "--control-path=userspace" in c["args"] and "runtimeClassName" not in pod
    assert pod["initContainers"][0]["image"] == "busybox:1.36"
    assert {v["name"]: v for v in pod["volumes"]}["models"]["emptyDir"] == {"sizeLimit": "4Gi"}


def test_device_caps_match_the_bundled_profiles() -> None:
    from infscaler.base.device import load_profile

    devices = yaml.safe_load((CHART / "values.yaml").read_text())["devices"]
    for name, spec in devices.items():
        p = load_profile(name)
        cpu = next(a for a in p.accelerators if a.engine == "cpu")
        assert spec["memoryCapMb"] == p.memory_cap_mb, name
        assert spec["cpu"] == len(cpu.cores), name


def test_the_schema_validation_is_not_vacuous() -> None:
    (ds,) = by_kind(
        render.render_chart(
            CHART, render.load_values(CHART, overrides={"deviceOverride": "orin-nx"})
        ),
        "DaemonSet",
    )
    ds["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "45s"
    with pytest.raises(kv.ValidationError):
        kv.validate(ds, K8S_VERSIONS[0], strict=True)


def test_renderer_follows_go_template_semantics(tmp_path: Path) -> None:
    r = render._Renderer({})
    run = lambda src, dot: r.run(render._parse(render._lex(src, "t"), {}, "t"), dot, {"$": dot})  # noqa: E731
    assert run("a  {{- 1 -}}  b", {}) == "a1b"
    assert (
        run("{{ range $k, $v := .m }}{{ $k }}={{ $v }};{{ end }}", {"m": {"b": 2, "a": 1}})
        == "a=1;b=2;"
    )
    assert run('{{ .x | default "d" }}|{{ .y | default "d" }}', {"x": "", "y": 0.5}) == "d|0.5"
    assert run("{{ with .s }}{{ . }}{{ else }}none{{ end }}", {"s": []}) == "none"
    assert run('{{ printf "%s-%d" .a 7 | trunc 4 }}', {"a": "abc"}) == "abc-"
    assert run("{{ if and .a (not .b) }}yes{{ end }}", {"a": 1, "b": False}) == "yes"
    with pytest.raises(render.TemplateError, match="not supported"):
        run("{{ lookup 1 }}", {})
