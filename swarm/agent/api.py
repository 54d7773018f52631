"""The daemon's local API: HTTP over ``$SWARM_HOME/daemon.sock`` (mode 0600).

    GET  /v1/health               {"node", "pid", "listen", "coordinator", "peers_from_asg"}
    POST /v1/fetch                a :class:`~swarm.messages.FetchRequest` -> status
    GET  /v1/artifacts            every artifact held (the node's report)
    GET  /v1/artifacts/IH         one :class:`~swarm.messages.ArtifactStatus`; with
                                  ``?wait=S`` (at most 5) answered once the artifact is
                                  verified or failed, or after S seconds (a long poll:
                                  ``swarm fetch`` learns it is done at once, not at its
                                  next poll)

Errors are ``{"error", "exit_code"}`` with status 400 (403 without the fleet token).
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler

from swarm.errors import AccessDeniedError, NotFoundError, SwarmError, UsageError
from swarm.fleetauth import bearer, token_matches
from swarm.messages import FetchRequest

if TYPE_CHECKING:
    from swarm.agent.daemon import Daemon


MAX_WAIT = 5.0
"""Longest ``?wait=`` a status request may ask for."""

WAIT_STEP = 0.02
"""How often a long poll looks at the artifact (a coroutine wake-up, no I/O)."""


def error_response(error: SwarmError) -> web.Response:
    return web.json_response({"error": str(error), "exit_code": error.exit_code}, status=400)


def make_api(daemon: Daemon) -> web.Application:
    routes = web.RouteTableDef()

    @web.middleware
    async def require_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        if daemon.token and not token_matches(
            bearer(request.headers.get("Authorization")), daemon.token
        ):
            return web.json_response(
                {
                    "error": "swarm: the daemon API needs the fleet token (SWARM_SECRET)",
                    "exit_code": AccessDeniedError.exit_code,
                },
                status=403,
            )
        return await handler(request)

    @routes.get("/v1/health")
    async def health(_: web.Request) -> web.Response:
        return web.json_response(
            {
                "node": daemon.node_id,
                "pid": os.getpid(),
                "listen": daemon.listen_ip,
                "coordinator": daemon.settings.coordinator,
                "peers_from_asg": sorted(daemon.asg_groups),
            }
        )

    @routes.post("/v1/fetch")
    async def fetch(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError as error:
            return error_response(UsageError(f"swarm: bad fetch request: {error}"))
        try:
            fetch_request = FetchRequest.from_json(body)
            loop = asyncio.get_running_loop()
            artifact = await loop.run_in_executor(None, daemon.fetch, fetch_request)
        except SwarmError as error:
            return error_response(error)
        return web.json_response(daemon.describe(artifact).to_json())

    @routes.get("/v1/artifacts")
    async def artifacts(_: web.Request) -> web.Response:
        return web.json_response(daemon.snapshot())

    @routes.get("/v1/artifacts/{info_hash}")
    async def artifact(request: web.Request) -> web.Response:
        found = daemon.lookup(request.match_info["info_hash"])
        if not found:
            return error_response(NotFoundError("swarm: this daemon holds no such artifact"))
        try:
            wait = min(MAX_WAIT, max(0.0, float(request.query.get("wait", 0))))
        except ValueError:
            return error_response(UsageError("swarm: ?wait= takes seconds"))
        loop = asyncio.get_running_loop()
        until = loop.time() + wait
        while not found.verified.is_set() and found.failure is None and loop.time() < until:
            await asyncio.sleep(WAIT_STEP)
        return web.json_response(daemon.describe(found).to_json())

    app = web.Application(middlewares=[require_token])
    app.add_routes(routes)
    return app
