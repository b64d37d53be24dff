"""HTTP layer: FastAPI routes, SSE, auth, errors. No engine imports."""

from glmserve.server.app import create_app

__all__ = ["create_app"]
