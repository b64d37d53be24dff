"""Open the state database: an SQLAlchemy ``Engine`` for a URL, its schema migrated to the
newest revision (Alembic, ``state/migrations``).

SQLite connections run in WAL mode (readers never wait for the writer) with a busy timeout, so
the server's threads and a second process on the same file take turns instead of failing. The
file holds every key's prompts, outputs and uploads: it is created 0600 (SQLite gives its WAL
and SHM files the same mode) in a folder created 0700. Migrations run under a lock, so
processes starting together on a fresh database migrate once: a file lock beside an SQLite
file (``filelock``), an advisory lock on PostgreSQL."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from filelock import FileLock
from sqlalchemy.engine import Engine

MIGRATIONS = Path(__file__).parent / "migrations"
_LOCK_ID = 0x676C6D73  # "glms": the advisory lock PostgreSQL replicas migrate under
DB_THREADS = 40  # PostgreSQL connections a server may hold: the threads that may ask for one at once


class DatabaseError(Exception):
    """The state database cannot be opened or migrated (a start-up error, one line)."""


def sqlalchemy_url(url: str) -> str:
    """``url`` with the driver this package uses: ``postgresql://`` and ``postgres://`` become
    ``postgresql+psycopg://`` (psycopg 3); ``sqlite:///PATH`` is kept. Raises ``ValueError``
    for any other scheme."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError(f"database URL {url!r}: expected postgresql://... or sqlite:///PATH")
    if scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return f"postgresql+psycopg://{rest}"
    if scheme == "sqlite":
        return url
    raise ValueError(f"database URL scheme {scheme!r} is not served: use postgresql:// or sqlite:///")


def _sqlite_pragmas(connection, _record) -> None:
    cursor = connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def open_database(url: str, private_folder: bool = False) -> Engine:
    """The state database on ``url``, a SQLAlchemy engine (``postgresql://...`` or
    ``sqlite:///PATH``; an SQLite file's folder is created, and made 0700 when
    ``private_folder``: ``--state-dir``, not a folder the user named), its schema migrated to
    the newest revision. Raises ``DatabaseError`` with a one-line reason when the database
    cannot be reached, created or migrated."""
    try:
        full = sqlalchemy_url(url)
    except ValueError as exc:
        raise DatabaseError(str(exc)) from None
    try:
        lock: contextlib.AbstractContextManager = contextlib.nullcontext()
        if full.startswith("sqlite"):
            file = sa.engine.make_url(full).database
            if file and file != ":memory:":
                lock = _private_file(Path(file), private_folder)
            database = sa.create_engine(full, connect_args={"timeout": 10})
            sa.event.listen(database, "connect", _sqlite_pragmas)
        else:
            # as many connections as threads may ask for one (asyncio's default executor: at most
            # 32; the batch work's and the routes' calls): a smaller pool made the rest wait 30 s, then 500
            database = sa.create_engine(full, pool_pre_ping=True, pool_size=4, max_overflow=DB_THREADS - 4)
        with lock:
            _migrate(database)
    except (sa.exc.SQLAlchemyError, OSError) as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        raise DatabaseError(f"state database {sa.engine.make_url(full).render_as_string(hide_password=True)}: "
                            f"{reason}") from None
    return database


@contextlib.contextmanager
def _private_file(database: Path, private_folder: bool) -> Iterator[None]:
    """Create ``database``'s folder (0700) and the file (0600) if they are not there, take
    from them (the folder: only when ``private_folder``) any permission beyond those, and hold
    the file lock ``<database>.lock`` (waiting up to 60 s for another process's migration)."""
    database.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.close(os.open(database, os.O_CREAT | os.O_RDWR, 0o600))
    if private_folder:
        _tighten(database.parent, 0o700)
    for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")):
        _tighten(path, 0o600)
    with FileLock(f"{database}.lock", timeout=60, mode=0o600):
        yield


def _sqlite_transactional(connection, record) -> None:
    """A migration's SQLite connection: Python's ``sqlite3`` left to itself commits a ``CREATE
    TABLE`` at once (it opens a transaction only before DML), so a crash inside a migration left
    its tables behind ("table already exists" on every start); here the driver opens none and
    ``BEGIN IMMEDIATE`` (``_begin``) opens one before anything, DDL included (SQLAlchemy's
    recipe for SQLite's transactional DDL)."""
    _sqlite_pragmas(connection, record)
    connection.isolation_level = None


def _begin(conn) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _tighten(path: Path, mode: int) -> None:
    """Take from ``path`` (if it is there, and this user's) the permissions beyond ``mode``: a
    state left 0644/0755 by an earlier version, readable by every user of the host, is made
    private, with a log line."""
    with contextlib.suppress(FileNotFoundError, PermissionError):
        st = path.stat()
        if st.st_uid == os.getuid() and st.st_mode & 0o777 & ~mode:
            os.chmod(path, st.st_mode & 0o777 & mode)
            logging.getLogger("glmserve.state").warning("%s was readable by others (mode %o): made %o", path,
                                                        st.st_mode & 0o777, st.st_mode & 0o777 & mode)


def _migrate(database: Engine) -> None:
    """Migrate to the newest revision in one transaction (on both databases: a crash inside a
    migration rolls all of it back)."""
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its INFO lines say nothing to a server's user
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    migrating = database
    if database.dialect.name == "sqlite" and database.url.database not in (None, "", ":memory:"):  # a file
        migrating = sa.create_engine(database.url, connect_args={"timeout": 10}, poolclass=sa.pool.NullPool)
        sa.event.listen(migrating, "connect", _sqlite_transactional)
        sa.event.listen(migrating, "begin", _begin)
    try:
        with migrating.begin() as connection:
            if database.dialect.name == "postgresql":
                connection.execute(sa.text("SELECT pg_advisory_xact_lock(:id)"), {"id": _LOCK_ID})
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        if migrating is not database:
            migrating.dispose()
