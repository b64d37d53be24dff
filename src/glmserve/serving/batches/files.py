"""A batch's files, a piece at a time (blocking: the bulk workers of ``serving/batches/service.py``
run these): an upload's bytes checked as UTF-8 as they are stored, a batch file's request lines
parsed as they are read, and the output and error files' lines made as they are stored. No step
holds a whole file, or the interpreter's lock for long (a whole 64 MiB file decoded or split at
once stalled the event loop's streams).

Shapes follow OpenAI's Batch API: input lines ``{"custom_id", "method": "POST", "url", "body"}``,
error objects ``{"code", "message", "param", "line"}`` (lines counted from 1)."""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Iterator
from typing import BinaryIO

import uuid

from glmserve.protocol.errors import invalid_request
from glmserve.state.batches import LineResult
from glmserve.state.files import CHUNK_BYTES, rechunk

MAX_LINES = 50_000  # OpenAI's limit of requests in one batch
OUTPUT_FILES = ("output_file_id", "error_file_id")  # an ended batch's files: 200 lines, the others


def checked_utf8(source: BinaryIO) -> Iterator[bytes]:
    """``source``'s bytes in pieces of ``CHUNK_BYTES``, each checked as UTF-8 before it is
    given (a character split between two pieces is fine). Raises a 400 ``APIError`` at the
    first piece that is not UTF-8 text (or when the text ends inside a character)."""
    check = codecs.getincrementaldecoder("utf-8")()
    try:
        while piece := source.read(CHUNK_BYTES):
            check.decode(piece)
            yield piece
        check.decode(b"", final=True)
    except UnicodeDecodeError:
        raise invalid_request("a batch file must be UTF-8 JSONL text", "file") from None


def lines_of(pieces: Iterable[bytes]) -> Iterator[bytes]:
    """The lines of the bytes given in ``pieces``, without their LF (JSONL's lines end at LF;
    a CRLF line keeps its CR, which JSON takes as space; a raw U+2028 inside a JSON string does
    not end a line, as ``str.splitlines`` would)."""
    head: list[bytes] = []  # the start of a line that runs on into the next piece
    for piece in pieces:
        start = 0
        while (end := piece.find(b"\n", start)) >= 0:
            yield b"".join((*head, piece[start:end])) if head else piece[start:end]
            head, start = [], end + 1
        if start < len(piece):
            head.append(piece[start:])
    if head:
        yield b"".join(head)


def parse_lines(lines: Iterable[bytes], endpoint: str) -> tuple[list[tuple[str, dict]], list[dict]]:
    """The requests of a batch file (its UTF-8 JSONL ``lines``) as ``(custom_id, body)``, and
    OpenAI's error objects for the lines that are not one, ``too_many_requests`` (no requests)
    past ``MAX_LINES`` or ``empty_file`` for none."""
    requests, errors, seen, count = [], [], set(), 0

    def error(code: str, message: str, line: int, param: str | None = None) -> None:
        errors.append({"code": code, "message": message, "param": param, "line": line})

    for n, row in enumerate(lines, 1):
        if not row.strip():
            continue
        count += 1
        if count > MAX_LINES:
            error("too_many_requests", f"a batch holds at most {MAX_LINES} requests, this file more", 0)
            return [], errors
        try:
            item = json.loads(row)
        except (ValueError, RecursionError):  # nested deeper than the parser goes is no request either
            error("invalid_json_line", "This line is not parseable as valid JSON.", n)
            continue
        if not isinstance(item, dict):
            error("invalid_request", "a line must be a JSON object", n)
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            error("missing_required_parameter", "custom_id must be a non-empty string", n, "custom_id")
        elif custom_id in seen:
            error("duplicate_custom_id", f"custom_id {custom_id!r} is used twice", n, "custom_id")
        elif item.get("method") != "POST":
            error("invalid_method", "method must be 'POST'", n, "method")
        elif item.get("url") != endpoint:
            error("mismatched_url", f"url must be the batch's endpoint {endpoint}", n, "url")
        elif not isinstance(item.get("body"), dict):
            error("missing_required_parameter", "body must be a request object", n, "body")
        elif item["body"].get("stream"):
            error("invalid_request", "stream is not served in a batch", n, "body.stream")
        else:
            seen.add(custom_id)
            requests.append((custom_id, item["body"]))
    if not count:
        error("empty_file", "the input file holds no request", 0)
    return requests, errors


def jsonl(records: Iterable[dict]) -> Iterator[bytes]:
    """``records`` as JSONL bytes, a line each (for ``FileStore.create``, which stores them in
    pieces as they come)."""
    for record in records:  # compact, as the results are stored (state.tables.dumps): no bytes added
        yield json.dumps(record, separators=(",", ":")).encode() + b"\n"


# the error file's line for a line not run, by the batch's end (OpenAI's code for an expired
# one; a batch stopped for room, ``failed``: each line answered, within the room it held since
# the batch was made, ``state.batches.LINE_RESERVE``). A cancelled batch's are not listed.
NOT_RUN = {"expired": {"code": "batch_expired",
                       "message": "This request could not be executed before the completion window expired."},
           "failed": {"code": "store_full",
                      "message": "This request was not run: the batch stopped when the server's store was full."}}


def _record(line: LineResult, not_run: dict | None) -> dict:
    """The output or error file's line of ``line`` (OpenAI's shape); ``not_run``: the error of
    a line that did not run."""
    if line.status_code is None:  # not run before the batch expired, or stopped for room
        return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id, "response": None,
                "error": not_run}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
            "response": {"status_code": line.status_code, "request_id": f"req_{uuid.uuid4().hex}",
                         "body": line.result}, "error": None}


def output_pieces(page: list[LineResult], status: str) -> dict[str, list[bytes]]:
    """A page of an ended batch's lines as the pieces (at most ``CHUNK_BYTES`` each) they add
    to its files: ``{"output_file_id": ..., "error_file_id": ...}``. A 200 goes to the output
    file, another status to the error file, a line not run to the error file with the error
    ``NOT_RUN`` gives for the batch's final ``status`` (not listed when it gives none)."""
    not_run = NOT_RUN.get(status)

    def kind(line: LineResult) -> str | None:
        if line.status_code == 200:
            return "output_file_id"
        return "error_file_id" if not_run or line.status_code is not None else None

    return {key: list(rechunk(jsonl(_record(line, not_run) for line in page if kind(line) == key)))
            for key in OUTPUT_FILES}
