"""The FastAPI app: auth, error shapes, lifespan of the gateway's clients, and the routers."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from cassandra import DriverException, RequestValidationException
from cassandra.cluster import NoHostAvailable
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from redis.exceptions import ConnectionError as RedisConnectionError
from starlette.exceptions import HTTPException as StarletteHTTPException

from infra.config.settings import Settings
from producers.gateway import openai_compat
from producers.gateway.errors import ApiError, from_framework, too_large, unavailable
from producers.gateway.guard import Guard
from producers.gateway.origins import TrustedHosts
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

    # docs_url/redoc_url off: FastAPI's own pages load Swagger UI from a CDN; ours serves it from a package.
    app = FastAPI(title="Parley", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="A chat service that streams LLM replies token by token over an event pipeline.")
    app.state.gateway = gateway
    app.add_middleware(TrustedHosts, settings=settings)  # before any route: DNS rebinding gets nothing
    app.add_middleware(Guard, settings=settings)  # outermost: body size and refusal budget before anything
    install_error_handlers(app)
    _include_routes(app)
    _offline_docs(app)
    _probes(app, gateway)
    return app


def _include_routes(app: FastAPI) -> None:
    from producers.gateway import (
        routes_account,
        routes_chat,
        routes_conversations,
        routes_export,
        routes_openai,
        routes_responses,
        routes_search,
        routes_session,
        routes_share,
        routes_tokens,
        routes_usage,
        routes_web,
    )

    app.include_router(routes_session.router)
    app.include_router(routes_conversations.router)
    app.include_router(routes_search.router)
    app.include_router(routes_chat.router)
    app.include_router(routes_openai.router)
    app.include_router(routes_responses.router)
    app.include_router(routes_usage.router)
    app.include_router(routes_tokens.router)
    app.include_router(routes_account.router)
    app.include_router(routes_export.router)
    app.include_router(routes_share.router)
    app.include_router(routes_share.page_router)
    routes_web.mount(app)


def _probes(app: FastAPI, gateway: Gateway) -> None:
    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "gateway": gateway.gateway_id}

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        """Prometheus text format: TTFT, tokens/s, replies, refusals, reconnects (producers/gateway/metrics.py)."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _offline_docs(app: FastAPI) -> None:
    """``/docs`` with Swagger UI's files from the swagger-ui-bundle-v2 package: works with no internet."""
    from fastapi.openapi.docs import get_swagger_ui_html
    from fastapi.responses import HTMLResponse
    from fastapi.staticfiles import StaticFiles
    from swagger_ui_bundle import swagger_ui_path

    app.mount("/docs-assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=app.openapi_url or "/openapi.json", title="Parley API",
                                   swagger_js_url="/docs-assets/swagger-ui-bundle.js",
                                   swagger_css_url="/docs-assets/swagger-ui.css",
                                   swagger_favicon_url="/docs-assets/favicon-32x32.png")


def install_error_handlers(app: FastAPI) -> None:
    """Every error a client can meet, in the documented shape (OpenAI's on OpenAI's paths)."""
    app.exception_handler(ApiError)(_api_error)
    app.exception_handler(StarletteHTTPException)(_http_error)
    app.exception_handler(RequestValidationError)(_invalid)
    app.exception_handler(UnicodeEncodeError)(_not_unicode)
    app.exception_handler(Exception)(_crashed)
    app.exception_handler(KafkaError)(_kafka_down)
    app.exception_handler(MessageSizeTooLargeError)(_kafka_too_large)
    app.exception_handler(NoHostAvailable)(_cassandra_down)
    app.exception_handler(DriverException)(_cassandra_error)
    app.exception_handler(RedisConnectionError)(_redis_down)


async def _api_error(request: Request, exc: ApiError) -> JSONResponse:
    return _render(request, exc)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """No route for this path (404) or method (405): OpenAI's shape for OpenAI's paths and anything
    unknown under /v1 (an OpenAI client calling an endpoint Parley lacks); the native shape elsewhere."""
    path = request.url.path
    if exc.status_code in (404, 405) and (openai_compat.applies(path) or (
            path.startswith("/v1/") and exc.status_code == 404)):
        body = openai_compat.unknown_route(request.method, path, exc.status_code)
        return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)
    # Everything else (405 on native routes, an unreadable body) in the documented error shape.
    response = _render(request, from_framework(exc.status_code, exc.detail))
    response.headers.update(exc.headers or {})  # 405's Allow
    return response


async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    problems = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        problems.append("the body is not valid JSON" if err.get("type") == "json_invalid"
                        else f"{where}: {err.get('msg')}")
    return _render(request, ApiError(422, "invalid_request", "; ".join(problems)))


async def _not_unicode(request: Request, exc: UnicodeEncodeError) -> JSONResponse:
    # A lone surrogate that slipped past the models' checks: bad input, not a server fault.
    return _render(request, ApiError(422, "invalid_text", "The text is not valid Unicode (a lone surrogate)."))


async def _crashed(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled %s on %s %s", type(exc).__name__, request.method, request.url.path)
    return _render(request, ApiError(500, "internal_error", "Something went wrong on our side; "
                                                           "nothing was charged. Try again."))


async def _backend(request: Request, name: str, exc: Exception) -> JSONResponse:
    log.warning("backend %s unreachable: %s", name, type(exc).__name__)
    return _render(request, unavailable(name))


async def _kafka_down(request: Request, exc: KafkaError) -> JSONResponse:
    return await _backend(request, "Kafka", exc)


async def _kafka_too_large(request: Request, exc: MessageSizeTooLargeError) -> JSONResponse:
    # Kafka itself refused the record as too large (a limit lower than the gateway's own check):
    # the same request can never succeed, so no Retry-After.
    log.warning("a request was too large for one Kafka record: %s", type(exc).__name__)
    return _render(request, too_large("The request is too large for one Kafka record. Send a shorter "
                                      "history or fewer messages."))


async def _cassandra_down(request: Request, exc: NoHostAvailable) -> JSONResponse:
    return await _backend(request, "Cassandra", exc)


async def _cassandra_error(request: Request, exc: DriverException) -> JSONResponse:
    if isinstance(exc, RequestValidationException):
        # Cassandra refused the query itself (a schema that lags the code, say): our fault, not an outage,
        # so it is not worth the client's retry.
        return await _crashed(request, exc)
    return await _backend(request, "Cassandra", exc)


async def _redis_down(request: Request, exc: RedisConnectionError) -> JSONResponse:
    return await _backend(request, "Redis", exc)


def _render(request: Request, err: ApiError) -> JSONResponse:
    return openai_compat.error_response(request.url.path, err)
