"""Reasoning handed to the client sealed: the ``encrypted_content`` of a ``/v1/responses``
``reasoning`` item (``include: ["reasoning.encrypted_content"]``), as OpenAI's Responses API
returns it for ``store: false`` requests.

The client cannot read or change it; sent back in a later request's ``input``, it is opened and
the model's own reasoning is replayed to the chat template (GLM's preserved thinking; the prompt
stays the prefix the previous turn left in the cache). Sealing is Fernet (AES-128-CBC with an
HMAC-SHA256 over the whole token: ``cryptography``'s authenticated encryption), so a forged,
truncated or edited token fails to open: a 400. A token is bound to the API key of the request
it was made for (its owner digest, sealed inside): another key's request cannot open it.

The key is a file under ``--state-dir`` (``encrypted_content.key``, created with mode 0600 the
first time a reasoning item is sealed, whole: written elsewhere, then linked into place), so a
token stays valid across restarts and for every replica that shares the directory. A token
sealed under another key (the file deleted, another machine) cannot be told from a forged one:
also a 400.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from glmserve.protocol.errors import invalid_request
from glmserve.serving.generation.request_scope import OWNER

KEY_FILE = "encrypted_content.key"


class ReasoningSeal:
    """Seal and open reasoning text with the key in ``state_dir`` (read or created on first use).

    ``seal(text) -> str`` (URL-safe base64); ``open(token, param) -> str`` raises a 400
    ``APIError`` naming ``param`` for a token this key did not seal."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir).expanduser() / KEY_FILE
        self._fernet: Fernet | None = None
        self._lock = threading.Lock()

    def _key(self) -> Fernet:
        with self._lock:
            if self._fernet is None:
                self._fernet = Fernet(self._read_or_create())
            return self._fernet

    def _read_or_create(self) -> bytes:
        """The key in ``path``; the first time, a new key written whole to a private temporary
        file and linked into place (``os.link`` fails if another process linked its key first:
        that one is read), so no reader ever sees an empty or partial key, even after a crash."""
        try:
            return self.path.read_bytes().strip()
        except FileNotFoundError:
            pass
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{KEY_FILE}.", dir=self.path.parent)  # mode 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key())
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(tmp, self.path)
        finally:
            os.unlink(tmp)
        return self.path.read_bytes().strip()

    def seal(self, text: str) -> str:
        """``text`` sealed for the request's API key (``OWNER``)."""
        return self._key().encrypt(json.dumps({"reasoning": text, "owner": OWNER.get()}).encode()).decode("ascii")

    def open(self, token: str, param: str) -> str:
        """The text ``token`` seals, for the API key that was given it only (another key's
        request gets the same 400 as for a forged token: it cannot tell a token it was not
        given from one that was never made)."""
        try:
            payload = json.loads(self._key().decrypt(token.encode("ascii", "replace")))
            if payload.get("owner", "") != OWNER.get():
                raise ValueError("sealed for another API key")
        except (InvalidToken, ValueError, AttributeError) as exc:
            raise invalid_request("encrypted_content could not be verified: it was not sealed by this server's key "
                                  "for this API key (or was changed)", param) from exc
        return payload["reasoning"]
