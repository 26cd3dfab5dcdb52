"""The layer contract (``.importlinter``, issue 16): it holds on the repository, and the
same check fails on a tree with a deliberate upward import; the service satisfies the
interface the runtime's control loop declares for it (:mod:`infscaler.runtime.scaling.control`).
"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import importlinter  # noqa: F401 - the dev extra; the checker runs it in a subprocess

from infscaler.modelless.tasks import RoutedService
from infscaler.runtime.scaling.control import DeploymentView, ScaledService
from infscaler.service.service import Deployment, Service
from tests import REPO_ROOT

REPO = REPO_ROOT


def _checker():
    spec = importlib.util.spec_from_file_location("lint_imports", REPO / "scripts/lint_imports.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_layer_contract_holds(tmp_path: Path) -> None:
    li = _checker()
    tree = li.lay_out(tmp_path)
    # the laid-out tree is the installed package: the mapped subpackages are inside it
    for sub in (
        "runtime",
        "runtime/serving",
        "runtime/processes",
        "runtime/scaling",
        "runtime/planning",
        "shm",
        "ebpf",
        "partitioner",
        "base",
        "engines",
        "modelless",
        "cli",
        "api",
        "service",
    ):
        assert (tree / "infscaler" / sub / "__init__.py").is_file(), sub
    res = li.lint(tree)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "0 broken" in res.stdout
    assert "KEPT" in res.stdout and "BROKEN" not in res.stdout


def test_layer_contract_fails_on_upward_import(tmp_path: Path) -> None:
    """The same contract on a copy with upward imports hidden the two ways imports hide:
    inside a function (runtime -> the facade's service) and under ``TYPE_CHECKING``
    (the base -> the runtime); a new module under infscaler/ with no layer fails too."""
    li = _checker()
    tree = li.lay_out(tmp_path)
    scaler = tree / "infscaler" / "runtime" / "scaling" / "scaler.py"
    scaler.write_text(
        scaler.read_text()
        + "\n\ndef _deliberate():\n"
        + "    from infscaler.service.service import Service  # runtime -> facade: upward\n\n"
        + "    return Service\n"
    )
    errors = tree / "infscaler" / "base" / "slo.py"
    errors.write_text(
        errors.read_text()
        + "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        + "    from infscaler.runtime.serving.pipeline import CompiledPipeline  # base -> runtime\n"
    )
    res = li.lint(tree)
    out = res.stdout
    assert res.returncode != 0, out
    assert "BROKEN" in out
    assert "infscaler.runtime.scaling.scaler -> infscaler.service" in out, out
    assert "infscaler.base.slo -> infscaler.runtime.serving.pipeline" in out, out

    # undo those; a module that is in no layer breaks the (exhaustive) contract
    li.lay_out(tmp_path)
    (tree / "infscaler" / "orphan.py").write_text('"""In no layer."""\n')
    res = li.lint(tree)
    assert res.returncode != 0 and "infscaler.orphan" in res.stdout, res.stdout


def test_sub_package_contracts_fail_on_a_wrong_way_import(tmp_path: Path) -> None:
    """The contracts between the runtime's sub-packages and the facade's parts: a request
    path module importing the planner (serving -> planning), a pure policy importing the
    supervisor (a process module), the API importing the CLI, and the protocol buffers
    importing the API each break one."""
    li = _checker()
    tree = li.lay_out(tmp_path)
    rt = tree / "infscaler" / "runtime"
    edits = {
        rt / "serving" / "route.py": "from infscaler.runtime.planning.planner import search\n",
        rt / "scaling" / "wakepolicy.py": (
            "from infscaler.runtime.processes.supervisor import Supervisor\n"
        ),
        tree / "infscaler" / "api" / "routes.py": "from infscaler.cli.client import infer_cmd\n",
        # the cycle api.grpc -> handlers -> modelconfig -> api.grpc came back this way
        tree / "infscaler" / "proto" / "model_config_pb2.py": (
            "from infscaler.api.modelconfig import model_config\n"
        ),
    }
    for path, line in edits.items():
        path.write_text(path.read_text() + "\n" + line)
    res = li.lint(tree)
    out = res.stdout
    assert res.returncode != 0, out
    assert "infscaler.runtime.serving.route -> infscaler.runtime.planning.planner" in out, out
    assert "infscaler.runtime.scaling.wakepolicy -> infscaler.runtime.processes" in out, out
    assert "infscaler.api.routes -> infscaler.cli.client" in out, out
    assert "infscaler.proto.model_config_pb2 -> infscaler.api.modelconfig" in out, out
    assert out.count("BROKEN") >= 4, out


def _members(proto: type) -> tuple[set[str], set[str]]:
    """(attribute names, method names) a Protocol declares."""
    attrs = set(vars(proto).get("__annotations__", {}))
    methods = {
        n
        for n, v in vars(proto).items()
        if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property))
    }
    return attrs, methods


def _assert_implements(proto: type, obj: object) -> None:
    """Every attribute ``proto`` declares exists on ``obj``, every method on its class,
    taking the parameters the protocol names: positional ones in order, keyword-only
    ones anywhere (properties: present)."""
    attrs, methods = _members(proto)
    for name in attrs:
        assert hasattr(obj, name), name
    for name in methods:
        impl = getattr(type(obj), name, None)
        assert impl is not None, name
        if isinstance(impl, property):
            continue
        assert callable(impl), name
        want, want_kw = _params(getattr(proto, name))
        have, have_kw = _params(impl)
        assert have[: len(want)] == want, (name, have, want)  # positional: in order
        assert want_kw <= have_kw | set(have), (name, want_kw, have_kw)  # keyword-only: present


def _params(fn: object) -> tuple[list[str], set[str]]:
    """(positional parameter names in order, keyword-only names) of ``fn``."""
    params = inspect.signature(fn).parameters.values()
    kw = inspect.Parameter.KEYWORD_ONLY
    return [p.name for p in params if p.kind != kw], {p.name for p in params if p.kind == kw}


def test_service_satisfies_the_control_interface(tmp_path: Path) -> None:
    """Every member :class:`ScaledService` declares exists on a :class:`Service` (an
    unstarted one: the started components are None until ``start``), and its methods take
    the parameters the protocol names, in order."""
    attrs, methods = _members(ScaledService)
    assert {"supervisor", "frontend", "channel", "pool"} <= attrs
    assert {"deployments", "device_profile", "scale_out", "scale_in"} <= methods
    _assert_implements(ScaledService, Service(state_dir=tmp_path))
    d_attrs, d_methods = _members(DeploymentView)
    for name in d_attrs | d_methods:
        assert hasattr(Deployment, name) or name in Deployment.__dataclass_fields__, name


def test_service_satisfies_the_task_routers_interface(tmp_path: Path) -> None:
    """The model-less layer's view of the service (:class:`RoutedService`, above the
    control loop's) is met by :class:`Service` too: members and parameter names."""
    _, methods = _members(RoutedService)
    assert {"deploy", "undeploy", "deployment", "submit", "stopping"} <= methods
    _assert_implements(RoutedService, Service(state_dir=tmp_path))


def test_service_satisfies_the_status_builders_interface(tmp_path: Path) -> None:
    """The status builders' view of the service (:class:`StatusSource`, described there so
    that the service and its status module do not import each other) is met by
    :class:`Service`."""
    from infscaler.service.status import StatusSource

    attrs, methods = _members(StatusSource)
    assert {"supervisor", "inflight", "started_at"} <= attrs
    assert {"deployments", "ready", "degraded"} <= methods
    _assert_implements(StatusSource, Service(state_dir=tmp_path))


_CYCLES = """
import sys, grimp
g = grimp.build_graph("infscaler", cache_dir=None)
prefixes = tuple(sys.argv[1:])
index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
def visit(v):
    index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
    for w in g.find_modules_directly_imported_by(v):
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1 and any(m.startswith(prefixes) for m in comp):
            out.append(sorted(comp))
sys.setrecursionlimit(10000)
for m in sorted(g.modules):
    if m not in index:
        visit(m)
print(repr(out))
"""


def _cycles(tree: Path, *prefixes: str) -> list[list[str]]:
    """Import cycles (strongly connected modules, function-level and TYPE_CHECKING imports
    included) that hold a module under one of ``prefixes``, found with grimp."""
    import ast
    import os
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-c", _CYCLES, *prefixes],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": str(tree)},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return ast.literal_eval(res.stdout.strip())


def test_no_import_cycles_in_the_facade_or_the_runtime(tmp_path: Path) -> None:
    """The facade's parts and the runtime's import no module that imports them back; a
    deliberate cycle (the codec importing the system shared memory registry, which imports
    the codec's tensors) is found."""
    li = _checker()
    tree = li.lay_out(tmp_path)
    parts = ("infscaler.cli", "infscaler.api", "infscaler.service", "infscaler.runtime")
    assert _cycles(tree, *parts) == []
    codec = tree / "infscaler" / "api" / "codec_tensors.py"
    codec.write_text(codec.read_text() + "\nfrom infscaler.api.sysshm import SharedMemoryRegion\n")
    found = _cycles(tree, *parts)
    assert any({"infscaler.api.codec_tensors", "infscaler.api.sysshm"} <= set(c) for c in found)
