"""The server's log lines, each naming the request it was written for: the ``x-request-id``
the response carries (``server/request_id.py``), so that a failure a client reports is found
in the log by the id its response (or the ``openai`` SDK's ``_request_id``) shows.

``glmserve serve`` configures logging with ``log_config`` (``logging.config.dictConfig``'s
form, which uvicorn also takes): glmserve's lines ``LEVEL logger REQUEST-ID: message`` on stderr
(no id outside a request), uvicorn's access lines ``LEVEL: CLIENT - "METHOD PATH HTTP/1.1"
STATUS REQUEST-ID`` on stdout."""

from __future__ import annotations

import logging
from typing import Any

from glmserve.server.request_id import REQUEST_ID


class RequestIdFilter(logging.Filter):
    """Sets ``record.request_id`` (the record's own ``extra`` one, else the request being
    handled, else ``-``) and ``record.request_tag`` (`` ID``, or empty outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        record.request_id = request_id or "-"
        record.request_tag = f" {request_id}" if request_id else ""
        return True


def log_config(level: str) -> dict[str, Any]:
    """The logging configuration of ``glmserve serve`` at ``level`` (``debug`` ... ``critical``)."""
    level = level.upper()
    request_id = {"request_id": {"()": RequestIdFilter}}
    return {
        "version": 1, "disable_existing_loggers": False, "filters": request_id,
        "formatters": {
            "default": {"format": "%(levelname)s %(name)s%(request_tag)s: %(message)s"},
            "access": {"()": "uvicorn.logging.AccessFormatter", "use_colors": False,
                       "fmt": '%(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s %(request_id)s'},
        },
        "handlers": {
            "default": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr",
                        "filters": ["request_id"]},
            "access": {"class": "logging.StreamHandler", "formatter": "access", "stream": "ext://sys.stdout",
                       "filters": ["request_id"]},
        },
        "root": {"handlers": ["default"], "level": level},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["access"], "level": level, "propagate": False},
        },
    }
