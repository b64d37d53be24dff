"""HTTP layer: FastAPI routes, SSE, auth, errors, each API's dialect. No engine library: only the engine
interface's types."""

from glmserve.server.app import AppOptions, create_app

__all__ = ["AppOptions", "create_app"]
