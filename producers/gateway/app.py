"""The FastAPI app: auth, error shapes, lifespan of the gateway's clients, and the routers."""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

from aiokafka.errors import KafkaError
from cassandra import DriverException
from cassandra.cluster import NoHostAvailable
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from redis.exceptions import ConnectionError as RedisConnectionError

from infra.settings import Settings
from producers.gateway.errors import ApiError, unavailable
from producers.gateway.state import Gateway

log = logging.getLogger(__name__)


def create_app(settings: Settings, models: dict[str, str], quota: object | None = None) -> FastAPI:
    gateway = Gateway(settings, models, quota=quota)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        log.info("gateway %s ready", gateway.gateway_id)
        yield
        await gateway.stop()

    app = FastAPI(title="Parley", version="0.1.0", lifespan=lifespan,
                  description="A chat service that streams LLM replies token by token over an event pipeline.")
    app.state.gateway = gateway
    _error_handlers(app)
    from producers.gateway import routes_chat, routes_conversations, routes_session, routes_web

    app.include_router(routes_session.router)
    app.include_router(routes_conversations.router)
    app.include_router(routes_chat.router)
    routes_web.mount(app)

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "gateway": gateway.gateway_id}

    return app


def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers())

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
            problems.append("the body is not valid JSON" if err.get("type") == "json_invalid"
                            else f"{where}: {err.get('msg')}")
        return JSONResponse({"error": {"code": "invalid_request", "message": "; ".join(problems)}}, status_code=422)

    async def backend(name: str, exc: Exception) -> JSONResponse:
        log.warning("backend %s unreachable: %s", name, type(exc).__name__)
        err = unavailable(name)
        return JSONResponse(err.body(), status_code=503, headers=err.headers())

    @app.exception_handler(KafkaError)
    async def kafka_down(_: Request, exc: KafkaError) -> JSONResponse:
        return await backend("Kafka", exc)

    @app.exception_handler(NoHostAvailable)
    async def cassandra_down(_: Request, exc: NoHostAvailable) -> JSONResponse:
        return await backend("Cassandra", exc)

    @app.exception_handler(DriverException)
    async def cassandra_error(_: Request, exc: DriverException) -> JSONResponse:
        return await backend("Cassandra", exc)

    @app.exception_handler(RedisConnectionError)
    async def redis_down(_: Request, exc: RedisConnectionError) -> JSONResponse:
        return await backend("Redis", exc)
