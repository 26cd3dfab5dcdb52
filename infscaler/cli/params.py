"""Parameter conversion without pydantic for the commands that must start fast (typer 0.26+
converts every parameter through a pydantic ``TypeAdapter``, ~0.1 s a run): plain
parameters get a conversion of their own with the same results and click's error
wording; any other keeps typer's, and an older typer is left alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from typer.core import TyperCommand


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise ValueError(value)


_PLAIN: dict[Any, Any] = {str: str, float: float, int: int, Path: Path, bool: _flag}


def plain_param(param: Any) -> None:
    """Give ``param`` the plain conversion when it is plain (see the module docstring)."""
    desc = getattr(param, "type_descriptor", None)
    if desc is None or not hasattr(param, "_runtime_param"):
        return
    from typer._coercion import RuntimeParam

    info, ann = desc.parameter_info, desc.annotation
    args = getattr(ann, "__args__", ())
    elem = args[0] if desc.is_list and len(args) == 1 else ann
    conv = _PLAIN.get(elem)
    checks = info.exists or info.resolve_path or info.writable or info.allow_dash
    if (
        conv is None
        or info.parser is not None
        or desc.is_ranged
        or desc.is_choice
        or desc.is_file
        or (elem is Path and (checks or not (info.file_okay and info.dir_okay)))
    ):
        return

    class Plain(RuntimeParam):
        def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
            if isinstance(value, (list, tuple)):
                return [self._coerce_value(v, param, ctx) for v in value]
            try:
                return conv(value)
            except (TypeError, ValueError):
                raise typer.BadParameter(
                    f"{value!r} is not a valid {elem.__name__}.", ctx=ctx, param=param
                ) from None

    param._runtime_param = Plain(parameter_info=info, annotation=ann)


def plain_params(params: Any) -> None:
    """:func:`plain_param` on each of a command's or group's parameters."""
    for p in params:
        plain_param(p)


class PlainParams:
    """A mixin for a click command or group: its parameters (``--help`` too) get
    :func:`plain_param` when the command line is parsed."""

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)  # type: ignore[misc]
        plain_params(params)
        return params


class FastCommand(PlainParams, TyperCommand):
    """A typer command whose plain parameters convert without pydantic
    (``@app.command("status", cls=FastCommand)``)."""
