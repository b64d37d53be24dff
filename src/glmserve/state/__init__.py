"""Durable state: what outlives a request and a restart (stored responses, background runs, conversations, files, batches),
in one database behind one interface. SQLite (a file in ``--state-dir``, WAL mode) by default,
PostgreSQL with ``--database-url`` (what several replicas share); the schema is kept by Alembic
migrations (``state/migrations``), run to the newest at start-up. Nothing here knows a wire
protocol: objects are stored as the JSON dicts the serving layer gives."""

from glmserve.state.batches import BatchStore, Build, ClaimedLine, LineResult, LostBuild
from glmserve.state.conversations import ConversationStore
from glmserve.state.database import DatabaseError, open_database, sqlalchemy_url
from glmserve.state.files import FileStore
from glmserve.state.quota import Quota, StoreFull
from glmserve.state.responses import ResponseStore, StoredResponse
from glmserve.state.tables import UnknownCursor

__all__ = ["BatchStore", "Build", "ClaimedLine", "LostBuild", "ConversationStore", "DatabaseError", "FileStore", "LineResult", "Quota",
           "ResponseStore", "StoreFull", "StoredResponse", "UnknownCursor", "open_database",
           "sqlalchemy_url"]
