"""HTTP layer: FastAPI routes, SSE, auth, errors. No engine imports."""

from glmserve.server.app import AppOptions, create_app

__all__ = ["AppOptions", "create_app"]
