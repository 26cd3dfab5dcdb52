"""Render the Helm chart ``deploy/helm/infscaler`` without helm: an interpreter for the
subset of Go's text/template (with Sprig / Helm functions) the chart uses, and the
chart's values checks (``values.schema.json``, jsonschema). Where ``helm`` is on PATH the
tests render with it too.

It stays because no helm binary can be installed here: PyPI has none (its ``helm`` is an
unrelated system monitor), Debian / Ubuntu apt has no package, helm's download hubs are
unreachable, and building ``helm.sh/helm/v3`` from source needs a Go toolchain CI lacks.

Supported, and nothing else (else :class:`TemplateError` naming the construct): actions
with ``{{-`` / ``-}}`` trimming and comments; ``if`` / ``else``, ``range`` (lists; maps
by sorted key), ``with``, ``define`` / ``include``, ``$x :=`` variables; pipelines,
parentheses, literals, field chains; the functions in ``_Renderer.funcs``. Go's
truthiness; a missing key is nil (helm's ``missingkey=zero``).

Sources: pkg.go.dev/text/template; helm.sh/docs/chart_template_guide/function_list.
Usage: ``python deploy/render.py deploy/helm/infscaler [-f values.yaml ...]`` prints the
manifests (exit 2 with the reasons when the values are refused).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import yaml

__all__ = ["TemplateError", "ValuesError", "check_values", "load_values", "render_chart"]


class TemplateError(Exception):
    """A template this renderer cannot run (or a Helm ``fail`` / ``required``)."""


class ValuesError(Exception):
    """Values the chart refuses; the message lists every problem by its path."""


# -- lexing and parsing --------------------------------------------------------------------

_ACTION = re.compile(r"\{\{(-\s)?(.*?)(\s-)?\}\}", re.S)


def _lex(src: str, name: str) -> list[tuple[str, str]]:
    """[("text", s) | ("action", body)] with trimming applied."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in _ACTION.finditer(src):
        text = src[pos : m.start()]
        if m.group(1):
            text = text.rstrip(" \t\r\n")
        out.append(("text", text))
        body = m.group(2).strip()
        out.append(("action", body))
        pos = m.end()
        if m.group(3):
            while pos < len(src) and src[pos] in " \t\r\n":
                pos += 1
    out.append(("text", src[pos:]))
    return out


_TOKEN = re.compile(
    r'\s*(?:(?P<str>"(?:[^"\\]|\\.)*"|`[^`]*`)|(?P<num>-?\d+(?:\.\d+)?)|(?P<op>:=|\||\(|\)|,|=)'
    r"|(?P<var>\$[A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)|(?P<field>(?:\.[A-Za-z0-9_]+)+|\.)"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*))"
)


def _tokens(s: str) -> list[tuple[str, str]]:
    out = []
    pos = 0
    s = s.rstrip()
    while pos < len(s):
        m = _TOKEN.match(s, pos)
        if not m or m.end() == pos:
            raise TemplateError(f"cannot read {s[pos:]!r} in action {{{{ {s} }}}}")
        kind = m.lastgroup
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


class _Node:
    def __init__(self, kind: str, **kw: Any) -> None:
        self.kind = kind
        self.__dict__.update(kw)


def _parse(items: list[tuple[str, str]], defines: dict[str, list[_Node]], name: str) -> list[_Node]:
    pos = 0

    def block(stops: tuple[str, ...]) -> tuple[list[_Node], str]:
        nonlocal pos
        nodes: list[_Node] = []
        while pos < len(items):
            kind, val = items[pos]
            pos += 1
            if kind == "text":
                if val:
                    nodes.append(_Node("text", text=val))
                continue
            if val.startswith("/*"):
                continue
            word = val.split(None, 1)[0] if val else ""
            rest = val[len(word) :].strip()
            if word in stops or (word == "else" and "else" in stops):
                return nodes, val
            if word in ("if", "with"):
                body, stop = block(("else", "end"))
                els: list[_Node] = []
                if stop.startswith("else"):
                    if stop[4:].strip():
                        raise TemplateError(f"{name}: `{stop}` is not supported: nest an if")
                    els, _ = block(("end",))
                nodes.append(_Node(word, expr=rest, body=body, els=els))
            elif word == "range":
                body, stop = block(("else", "end"))
                els = block(("end",))[0] if stop.startswith("else") else []
                nodes.append(_Node("range", expr=rest, body=body, els=els))
            elif word == "define":
                dname = json.loads(rest)
                body, _ = block(("end",))
                defines[dname] = body
            elif word == "end":
                raise TemplateError(f"{name}: unexpected {{{{ end }}}}")
            else:
                nodes.append(_Node("expr", expr=val))
        if stops:
            raise TemplateError(f"{name}: missing {{{{ end }}}}")
        return nodes, ""

    nodes, _ = block(())
    return nodes


# -- evaluation ----------------------------------------------------------------------------


def _truthy(v: Any) -> bool:
    if v is None or v is False:
        return False
    if isinstance(v, int | float) and not isinstance(v, bool):
        return v != 0
    if isinstance(v, str | list | dict | tuple):
        return len(v) > 0
    return True


def _to_yaml(v: Any) -> str:
    if v is None:
        return "null"
    return yaml.safe_dump(v, default_flow_style=False, sort_keys=True, width=10000).rstrip("\n")


def _str(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    if isinstance(v, dict | list):
        # Go prints maps as map[k:v]; the chart never does it on purpose
        raise TemplateError(f"printing a {type(v).__name__} directly: use toYaml")
    return str(v)


def _printf(fmt: str, *args: Any) -> str:
    it = iter(args)

    def rep(m: re.Match[str]) -> str:
        if m.group(0) == "%%":
            return "%"
        return _str(next(it))

    return re.sub(r"%%|%[sdv]", rep, fmt)


class _Renderer:
    def __init__(self, defines: dict[str, list[_Node]]) -> None:
        self.defines = defines
        self.funcs = {
            "include": self._include,
            "toYaml": _to_yaml,
            "toJson": lambda v: json.dumps(v, separators=(",", ":")),
            "nindent": lambda n, s: (
                "\n" + "\n".join(" " * int(n) + ln if ln else ln for ln in _str(s).split("\n"))
            ),
            "quote": lambda *v: " ".join(json.dumps(_str(x)) for x in v),
            "default": lambda d, v=None: v if _truthy(v) else d,
            "printf": _printf,
            "trunc": lambda n, s: _str(s)[: int(n)],
            "trimSuffix": lambda suf, s: (
                _str(s)[: -len(suf)] if suf and _str(s).endswith(suf) else _str(s)
            ),
            "add": lambda *a: sum(int(x) for x in a),
            "div": lambda a, b: int(a) // int(b),
            "mul": lambda *a: math.prod(int(x) for x in a),
            "and": lambda *a: next((x for x in a if not _truthy(x)), a[-1]),
            "or": lambda *a: next((x for x in a if _truthy(x)), a[-1]),
            "not": lambda v: not _truthy(v),
            "eq": lambda a, *b: any(a == x for x in b),
            "ne": lambda a, b: a != b,
            "has": lambda needle, lst: needle in (lst or []),
            "index": self._index,
            "dict": lambda *kv: {kv[i]: kv[i + 1] for i in range(0, len(kv), 2)},
        }

    @staticmethod
    def _index(v: Any, *keys: Any) -> Any:
        for k in keys:
            if v is None:
                raise TemplateError(f"index of nil with {k!r}")
            v = v.get(k) if isinstance(v, dict) else v[int(k)]
        return v

    def _include(self, name: str, ctx: Any) -> str:
        if name not in self.defines:
            raise TemplateError(f"include: no template named {name!r}")
        return self.run(self.defines[name], ctx, {"$": ctx})

    # pipelines
    def eval(self, toks: list[tuple[str, str]], dot: Any, vars_: dict[str, Any]) -> Any:
        cmds: list[list] = [[]]
        cur: list = cmds[0]
        i = 0
        while i < len(toks):
            kind, val = toks[i]
            if kind == "op" and val == "(":
                # find the matching paren
                depth, j = 1, i + 1
                while depth:
                    if toks[j] == ("op", "("):
                        depth += 1
                    elif toks[j] == ("op", ")"):
                        depth -= 1
                    j += 1
                cur.append(("group", toks[i + 1 : j - 1]))
                i = j
                continue
            if kind == "op" and val == "|":
                cur = []
                cmds.append(cur)
            else:
                cur.append((kind, val))
            i += 1
        result: Any = _MISSING
        for cmd in cmds:
            if not cmd:
                raise TemplateError("empty command in a pipeline")
            result = self._command(cmd, dot, vars_, result)
        return result

    def _operand(self, tok: tuple[str, Any], dot: Any, vars_: dict[str, Any]) -> Any:
        kind, val = tok
        if kind == "group":
            return self.eval(val, dot, vars_)
        if kind == "str":
            return json.loads(val) if val.startswith('"') else val[1:-1]
        if kind == "num":
            return float(val) if "." in val else int(val)
        if kind == "field":
            return dot if val == "." else self._chain(dot, val[1:].split("."))
        if kind == "var":
            head, *rest = val.split(".")
            if head not in vars_:
                raise TemplateError(f"undefined variable {head}")
            return self._chain(vars_[head], rest)
        if kind == "ident":
            if val in ("true", "false"):
                return val == "true"
            if val == "nil":
                return None
            return ("func", val)
        raise TemplateError(f"unexpected {val!r}")

    @staticmethod
    def _chain(v: Any, names: list[str]) -> Any:
        for n in names:
            if v is None:
                return None
            if isinstance(v, dict):
                v = v.get(n)
            else:
                raise TemplateError(f"can't evaluate field {n} in a {type(v).__name__}")
        return v

    def _command(self, cmd: list, dot: Any, vars_: dict[str, Any], piped: Any) -> Any:
        first = self._operand(cmd[0], dot, vars_)
        if isinstance(first, tuple) and first and first[0] == "func":
            fname = first[1]
            if fname not in self.funcs:
                raise TemplateError(f"function {fname!r} is not supported by this renderer")
            args = [self._operand(t, dot, vars_) for t in cmd[1:]]
            if piped is not _MISSING:
                args.append(piped)
            try:
                return self.funcs[fname](*args)
            except TemplateError:
                raise
            except Exception as exc:  # noqa: BLE001 - a wrong call in a template
                raise TemplateError(f"{fname}{tuple(args)!r}: {exc}") from None
        if len(cmd) > 1 or piped is not _MISSING:
            raise TemplateError(f"{cmd[0][1]} is not a function")
        return first

    def _assign(self, expr: str) -> tuple[list[str], list[tuple[str, str]]]:
        toks = _tokens(expr)
        if len(toks) >= 2 and toks[1] == ("op", ":="):
            return [toks[0][1]], toks[2:]
        if len(toks) >= 4 and toks[1] == ("op", ",") and toks[3] == ("op", ":="):
            return [toks[0][1], toks[2][1]], toks[4:]
        return [], toks

    def run(self, nodes: list[_Node], dot: Any, vars_: dict[str, Any]) -> str:
        out: list[str] = []
        vars_ = dict(vars_)
        for n in nodes:
            if n.kind == "text":
                out.append(n.text)
            elif n.kind == "expr":
                names, toks = self._assign(n.expr)
                v = self.eval(toks, dot, vars_)
                if names:
                    vars_[names[0]] = v
                else:
                    out.append(_str(v))
            elif n.kind in ("if", "with"):
                names, toks = self._assign(n.expr)
                v = self.eval(toks, dot, vars_)
                inner = dict(vars_)
                if names:
                    inner[names[0]] = v
                if _truthy(v):
                    out.append(self.run(n.body, v if n.kind == "with" else dot, inner))
                else:
                    out.append(self.run(n.els, dot, vars_))
            elif n.kind == "range":
                names, toks = self._assign(n.expr)
                v = self.eval(toks, dot, vars_)
                if v is None:
                    pairs: list[tuple[Any, Any]] = []
                elif isinstance(v, dict):
                    pairs = sorted(v.items())
                elif isinstance(v, list | tuple):
                    pairs = list(enumerate(v))
                elif isinstance(v, int):
                    pairs = [(i, i) for i in range(v)]
                else:
                    raise TemplateError(f"range over a {type(v).__name__}")
                if not pairs:
                    out.append(self.run(n.els, dot, vars_))
                for k, item in pairs:
                    inner = dict(vars_)
                    if len(names) == 1:
                        inner[names[0]] = item
                    elif len(names) == 2:
                        inner[names[0]], inner[names[1]] = k, item
                    out.append(self.run(n.body, item, inner))
        return "".join(out)


_MISSING = object()


# -- the chart -----------------------------------------------------------------------------


def _merge(base: Any, over: Any) -> Any:
    """Helm's values coalescing: maps merge key by key, anything else replaces; a null
    removes the key."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for k, v in over.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _merge(base.get(k), v)
        return out
    return over


def load_values(
    chart: Path, files: list[Path] | None = None, overrides: dict | None = None
) -> dict:
    """The chart's values.yaml merged with ``files`` (``-f``) and ``overrides``.

    Raises:
        ValuesError: a values file that cannot be read or is not a mapping.
    """
    values = yaml.safe_load((chart / "values.yaml").read_text()) or {}
    for f in files or []:
        try:
            data = yaml.safe_load(Path(f).read_text())
        except (OSError, yaml.YAMLError) as exc:
            raise ValuesError(f"cannot read values file {f}: {exc}") from None
        if data is None:
            continue
        if not isinstance(data, dict):
            raise ValuesError(f"values file {f} must be a mapping, got {type(data).__name__}")
        values = _merge(values, data)
    if overrides:
        values = _merge(values, overrides)
    return values


def _json_path(path: Any) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top)"


def check_values(chart: Path, values: dict) -> None:
    """``values.schema.json`` (what ``helm install`` / ``helm template`` enforce), then
    the chart's cross-field rules (what no JSON schema says): every group's pipelines
    exist, every group's device is a known device.

    Raises:
        ValuesError: every problem, one per line, by its values path.
    """
    import jsonschema

    schema = json.loads((chart / "values.schema.json").read_text())
    v = jsonschema.Draft7Validator(schema)
    problems = [
        f"{_json_path(e.absolute_path)}: {e.message}"
        for e in sorted(v.iter_errors(values), key=lambda e: list(map(str, e.absolute_path)))
    ]
    if not problems:
        pipes = set(values.get("pipelines") or {})
        devices = set(values.get("devices") or {})
        names = [g["name"] for g in values.get("groups", [])]
        if len(set(names)) != len(names):
            problems.append(f"groups: group names must be unique (got {names})")
        for i, g in enumerate(values.get("groups", [])):
            missing = sorted(set(g.get("pipelines") or []) - pipes)
            if missing:
                problems.append(
                    f"groups[{i}].pipelines: {missing} are not in pipelines "
                    f"(defined: {sorted(pipes) or 'none'})"
                )
            dev = g.get("device") or values.get("deviceOverride")
            if dev and dev not in devices:
                problems.append(
                    f"groups[{i}].device: unknown device {dev!r} (devices: {sorted(devices)})"
                )
    if problems:
        raise ValuesError("the values are refused:\n  " + "\n  ".join(problems))


def render_chart(
    chart: str | Path,
    values: dict | None = None,
    *,
    release: str = "infscaler",
    namespace: str = "infscaler",
) -> list[dict]:
    """Render every template of ``chart`` with ``values`` (default: its values.yaml),
    checked first (:func:`check_values`). Returns the manifests (parsed YAML documents,
    empty ones dropped), in template order.

    Raises:
        ValuesError: refused values. TemplateError: a template this renderer cannot run.
    """
    chart = Path(chart)
    if values is None:
        values = load_values(chart)
    check_values(chart, values)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    ctx = {
        "Values": values,
        "Release": {
            "Name": release,
            "Namespace": namespace,
            "Service": "Helm",
            "IsInstall": True,
            "IsUpgrade": False,
        },
        "Chart": {
            "Name": meta["name"],
            "Version": meta["version"],
            "AppVersion": meta.get("appVersion", ""),
        },
        "Capabilities": {},
    }
    defines: dict[str, list[_Node]] = {}
    bodies = []
    for path in sorted((chart / "templates").iterdir()):
        if path.suffix not in (".yaml", ".tpl", ".yml"):
            continue
        nodes = _parse(_lex(path.read_text(), path.name), defines, path.name)
        if not path.name.startswith("_"):
            bodies.append((path.name, nodes))
    r = _Renderer(defines)
    docs: list[dict] = []
    for name, nodes in bodies:
        text = r.run(nodes, ctx, {"$": ctx})
        try:
            for d in yaml.safe_load_all(text):
                if d:
                    docs.append(d)
        except yaml.YAMLError as exc:
            raise TemplateError(f"{name} rendered invalid YAML: {exc}\n{text}") from None
    return docs


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="render the chart (a helm template subset)")
    ap.add_argument("chart", type=Path)
    ap.add_argument("-f", "--values", type=Path, action="append", default=[])
    ap.add_argument("--release", default="infscaler")
    ap.add_argument("--namespace", default="infscaler")
    a = ap.parse_args(argv)
    try:
        docs = render_chart(
            a.chart, load_values(a.chart, a.values), release=a.release, namespace=a.namespace
        )
    except (ValuesError, TemplateError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(docs, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
