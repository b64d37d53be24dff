"""``GET /openapi.json`` (behind ``--api-key`` when one is set) and, only when no key is set,
the ``/docs`` and ``/redoc`` pages (a browser page cannot send the key with its spec request)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

spec_router = APIRouter()
pages_router = APIRouter()


@spec_router.get("/openapi.json", include_in_schema=False)
async def openapi(request: Request) -> JSONResponse:
    return JSONResponse(request.app.openapi())


@pages_router.get("/docs", include_in_schema=False)
async def swagger_ui(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{request.app.title} - Swagger UI")


@pages_router.get("/redoc", include_in_schema=False)
async def redoc(request: Request) -> HTMLResponse:
    return get_redoc_html(openapi_url="/openapi.json", title=f"{request.app.title} - ReDoc")
