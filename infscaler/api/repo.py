"""The inference API's privileged and per-user routes: the model repository extension
(deploy / undeploy pipelines: the service's own user and root only) and the system shared
memory extension (regions belong to the uid that registered them).

Sources: KServe / Triton ``protocol/`` docs (``extension_model_repository.md``,
``extension_shared_memory.md``); who may call what: :mod:`infscaler.base.security`.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import yaml
from aiohttp import web

from infscaler.api.codec import parse_json_object
from infscaler.api.common import (
    LIMITS,
    SECURITY,
    SERVICE,
    SHM,
    error_response,
    json_response,
    shm_of,
)
from infscaler.api.routes import model_entry, read_body
from infscaler.base.config import load_pipeline
from infscaler.base.security import peer_of, require_privileged

# -- model repository ------------------------------------------------------------------


def _owner_only(request: web.Request, what: str) -> None:
    require_privileged(peer_of(request), what)


async def repository_index(request: web.Request) -> web.Response:
    _owner_only(request, "the model repository index")
    service = request.app[SERVICE]
    return json_response(
        [
            {
                "name": d.name,
                "version": "1",
                "state": model_entry(service, d)["state"],
                "reason": "",
            }
            for d in service.deployments()
        ]
    )


async def _body_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, at most the control routes' body limit
    (:attr:`~infscaler.base.quotas.PeerQuotas.control_body_kb`; 413 beyond)."""
    raw = await read_body(request, request.app[LIMITS].quotas.control_body_bytes)
    if not raw:
        return {}
    return parse_json_object(raw, "body")  # strict UTF-8, bounded depth; else 400


async def repository_load(request: web.Request) -> web.Response:
    """Deploy a pipeline: ``{"parameters": {"config": "<pipeline as JSON or YAML>"}}``;
    the config's name is set to the URL's. Replaces a deployed pipeline of that name once
    the new one is ready (Triton's reload)."""
    _owner_only(request, "loading a model")
    service = request.app[SERVICE]
    name = request.match_info["name"]
    data = await _body_json(request)
    config = (data.get("parameters") or {}).get("config")
    if not isinstance(config, str) or not config.strip():
        return error_response(
            "load needs the pipeline in parameters.config (a JSON or YAML string)", 400
        )
    try:
        parsed = yaml.safe_load(config)
    except yaml.YAMLError as exc:
        return error_response(f"parameters.config is not valid JSON / YAML: {exc}", 400)
    if isinstance(parsed, dict):
        parsed["name"] = name
    cfg = load_pipeline(parsed if isinstance(parsed, dict) else config)
    policy = request.app[SECURITY]
    policy.check_pipeline(cfg)  # 403 before anything of it is read or imported
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    await loop.run_in_executor(
        None,
        lambda: service.deploy(cfg, replace=True, allowed_functions=policy.function_modules),
    )
    return json_response(
        {"name": name, "loaded": True, "seconds": round(time.perf_counter() - t0, 2)}
    )


async def repository_unload(request: web.Request) -> web.Response:
    _owner_only(request, "unloading a model")
    service = request.app[SERVICE]
    name = request.match_info["name"]
    service.deployment(name)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, service.undeploy, name)
    return json_response({"name": name, "unloaded": True})


# -- system shared memory --------------------------------------------------------------


async def shm_status(request: web.Request) -> web.Response:
    return json_response(shm_of(request).status(request.match_info.get("name")))


async def shm_register(request: web.Request) -> web.Response:
    data = await _body_json(request)
    try:
        key, offset, size = data["key"], int(data.get("offset", 0)), int(data["byte_size"])
    except (KeyError, TypeError, ValueError):
        return error_response('register needs {"key": str, "offset": int, "byte_size": int}', 400)
    request.app[SHM].register(request.match_info["name"], str(key), offset, size, peer_of(request))
    return json_response({})


async def shm_unregister(request: web.Request) -> web.Response:
    request.app[SHM].unregister(request.match_info.get("name"), peer_of(request))
    return json_response({})
