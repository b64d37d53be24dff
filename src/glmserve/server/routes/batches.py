"""Files and batches: OpenAI's ``/v1/files`` and ``/v1/batches``, Anthropic's
``/v1/messages/batches`` (``anthropic_router``: Anthropic's key header and error bodies), over
``serving/batches/`` (``BatchService``, its ``file_service`` and ``message_batches``). Everything belongs to the API key that made it (``server/auth.owner``)."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response, StreamingResponse

from glmserve.protocol.batches import BatchCreateRequest, MessageBatchCreateRequest
from glmserve.server.auth import owner
from glmserve.server.endpoints import ENDPOINTS, dialect_of
from glmserve.server.errors import ASCIIJSONResponse as JSONResponse
from glmserve.server.openapi import error_responses
from glmserve.serving.batches.service import BatchService

router = APIRouter()
anthropic_router = APIRouter()
MESSAGES = dialect_of("/v1/messages/batches")


def _service(request: Request) -> BatchService:
    return request.app.state.batches


@router.post("/v1/files", responses=error_responses(400, 413, 429))
async def upload_file(request: Request, file: UploadFile = File(...),  # noqa: B008 (FastAPI's form fields)
                      purpose: str = Form(...)) -> JSONResponse:  # noqa: B008
    # the spooled upload is read, checked and stored in a worker thread (serving/batches/file_service.py)
    return JSONResponse(await _service(request).file_service.upload(owner(request), purpose, file.filename or "", file.file))


@router.get("/v1/files", responses=error_responses(400))
async def list_files(request: Request, purpose: str | None = None, after: str | None = None,
                     limit: int = Query(10000, ge=1, le=10000), order: Literal["asc", "desc"] = "desc") -> JSONResponse:
    return JSONResponse(await _service(request).file_service.list_files(owner(request), purpose, after, limit, order))


@router.get("/v1/files/{file_id}", responses=error_responses(404))
async def get_file(file_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).file_service.file(owner(request), file_id))


@router.delete("/v1/files/{file_id}", responses=error_responses(404))
async def delete_file(file_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).file_service.delete_file(owner(request), file_id))


@router.get("/v1/files/{file_id}/content", responses={
    200: {"description": "The file's bytes", "content": {"application/octet-stream": {}}}, **error_responses(404)})
async def file_content(file_id: str, request: Request) -> Response:
    # streamed a stored piece at a time, its length declared: a file deleted meanwhile ends short
    file, pieces = await _service(request).file_service.file_content(owner(request), file_id)
    return StreamingResponse(pieces, media_type="application/octet-stream",
                             headers={"content-length": str(file["bytes"])})


@router.post("/v1/batches", responses=error_responses(400, 404, 429))
async def create_batch(body: BatchCreateRequest, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).create(owner(request), body.input_file_id, body.endpoint,
                                                       body.completion_window, body.metadata, ENDPOINTS))


@router.get("/v1/batches", responses=error_responses(400))
async def list_batches(request: Request, after: str | None = None,
                       limit: int = Query(20, ge=1, le=100)) -> JSONResponse:
    return JSONResponse(await _service(request).list(owner(request), after, limit))


@router.get("/v1/batches/{batch_id}", responses=error_responses(404))
async def get_batch(batch_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).get(owner(request), batch_id))


@router.post("/v1/batches/{batch_id}/cancel", responses=error_responses(400, 404))
async def cancel_batch(batch_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).cancel(owner(request), batch_id))


@router.delete("/v1/batches/{batch_id}", responses=error_responses(400, 404))
async def delete_batch(batch_id: str, request: Request) -> JSONResponse:
    """Not in OpenAI's API (its batches are kept): an ended batch, its lines and its output and
    error files deleted, so that they stop counting against ``--store-max-bytes``."""
    return JSONResponse(await _service(request).delete(owner(request), batch_id))


def _message_batch(body: dict, request: Request) -> dict:
    """Anthropic's message batch object: no internal status, and a ``results_url`` once ended."""
    shown = {k: v for k, v in body.items() if k != "status"}
    if shown["processing_status"] == "ended":
        shown["results_url"] = str(request.url_for("message_batch_results", batch_id=body["id"]))
    return shown


@anthropic_router.post("/v1/messages/batches", responses=error_responses(400, dialect=MESSAGES))
async def create_message_batch(body: MessageBatchCreateRequest, request: Request) -> JSONResponse:
    return JSONResponse(_message_batch(await _service(request).message_batches.create(owner(request), body.requests),
                                       request))


@anthropic_router.get("/v1/messages/batches", responses=error_responses(400, dialect=MESSAGES))
async def list_message_batches(request: Request, after_id: str | None = None,
                               limit: int = Query(20, ge=1, le=1000)) -> JSONResponse:
    page = await _service(request).list(owner(request), after_id, limit, "anthropic")
    return JSONResponse({"data": [_message_batch(b, request) for b in page["data"]], "has_more": page["has_more"],
                         "first_id": page["first_id"], "last_id": page["last_id"]})


@anthropic_router.get("/v1/messages/batches/{batch_id}", responses=error_responses(404, dialect=MESSAGES))
async def get_message_batch(batch_id: str, request: Request) -> JSONResponse:
    return JSONResponse(_message_batch(await _service(request).get(owner(request), batch_id, "anthropic"), request))


@anthropic_router.post("/v1/messages/batches/{batch_id}/cancel", responses=error_responses(404, dialect=MESSAGES))
async def cancel_message_batch(batch_id: str, request: Request) -> JSONResponse:
    return JSONResponse(_message_batch(await _service(request).cancel(owner(request), batch_id, "anthropic"),
                                       request))


@anthropic_router.delete("/v1/messages/batches/{batch_id}", responses=error_responses(400, 404, dialect=MESSAGES))
async def delete_message_batch(batch_id: str, request: Request) -> JSONResponse:
    return JSONResponse(await _service(request).delete(owner(request), batch_id, "anthropic"))


@anthropic_router.get("/v1/messages/batches/{batch_id}/results", name="message_batch_results", responses={
    200: {"description": "The results, one JSON object a line", "content": {"application/binary": {}}},
    **error_responses(400, 404, dialect=MESSAGES)})
async def message_batch_results(batch_id: str, request: Request) -> Response:
    return StreamingResponse(await _service(request).message_batches.results(owner(request), batch_id),
                             media_type="application/binary")
