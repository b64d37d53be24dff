"""A local server speaking the Hugging Face Hub's HTTP API, as ``huggingface_hub`` calls it
(``HF_ENDPOINT``): repository info and file trees (``/api/models/ORG/NAME[/revision/REV]``,
``.../tree/REV``), files by name with their commit, ETag and size (``HEAD`` and ``GET
/ORG/NAME/resolve/REV/PATH``, ranges too: a cut download resumes), a gated repository (401
``GatedRepo``) and missing ones (404 ``RepoNotFound``). ``cut_after``: the first download of a
file sends only that many bytes, then drops the connection; ``gets`` records each download with
the offset it started at (its ``Range``), so that a resume is seen to start where the cut was.
``revisions[repo][REV]``: a repository's files at another branch, tag or commit than ``main``
(the Hub's 404 ``RevisionNotFound`` for one it lacks); ``outage``: while set, every request is
answered with that status (a 429 or a 5xx), as a Hub in trouble does."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote


class Hub:
    """Repositories in memory: ``repos[name] = {path: bytes}``; ``gated``: names that answer 401."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: frozenset[str] = frozenset(),
                 cut_after: int | None = None, revisions: dict[str, dict[str, dict[str, bytes]]] | None = None,
                 outage: int | None = None) -> None:
        self.repos, self.gated, self.cut_after, self.outage = repos, gated, cut_after, outage
        self.revisions = revisions or {}
        self.cut: set[str] = set()  # files whose first download was cut
        self.gets: list[tuple[str, int]] = []  # the files downloaded (GET) and their start offsets, in order
        self.refused = 0  # requests answered with ``outage``

    def files(self, repo: str, revision: str) -> dict[str, bytes] | None:
        """``repo``'s files at ``revision`` (a branch or tag name, or a commit sha); None: no such revision."""
        if revision == "main" or revision == self.sha(repo, self.repos[repo]):
            return self.repos[repo]
        for name, files in self.revisions.get(repo, {}).items():
            if revision in (name, self.sha(repo, files)):
                return files
        return None

    def sha(self, repo: str, files: dict[str, bytes] | None = None) -> str:
        files = self.repos[repo] if files is None else files
        return hashlib.sha1(repr(sorted((p, hashlib.sha1(b).hexdigest()) for p, b in files.items()))
                            .encode()).hexdigest()


def _etag(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _refused(self, repo: str, head: bool) -> bool:
            if repo in hub.gated:
                self._send(401, b'{"error": "gated"}', {"X-Error-Code": "GatedRepo", "X-Error-Message":
                                                        f"Access to model {repo} is restricted."}, head)
                return True
            if repo not in hub.repos:
                self._send(404, b'{"error": "not found"}', {"X-Error-Code": "RepoNotFound", "X-Error-Message":
                                                            "Repository not found"}, head)
                return True
            return False

        def _revision(self, repo: str, revision: str, head: bool) -> dict[str, bytes] | None:
            files = hub.files(repo, revision)
            if files is None:
                self._send(404, b'{"error": "revision"}', {"X-Error-Code": "RevisionNotFound", "X-Error-Message":
                                                           f"Invalid rev id: {revision}"}, head)
            return files

        def _api(self, repo: str, rest: str) -> None:
            if self._refused(repo, False):
                return
            kind, _, revision = rest.partition("/")
            if (files := self._revision(repo, revision.split("/", 1)[0], False)) is None:
                return
            if kind == "revision":
                body = {"id": repo, "modelId": repo, "sha": hub.sha(repo, files), "private": False,
                        "siblings": [{"rfilename": p, "size": len(b)} for p, b in sorted(files.items())]}
            else:  # tree/REV
                body = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                        for p, b in sorted(files.items())]
            self._send(200, json.dumps(body).encode(), {"Content-Type": "application/json"})

        def _file(self, repo: str, revision: str, path: str, head: bool) -> None:
            if self._refused(repo, head) or (files := self._revision(repo, revision, head)) is None:
                return
            data = files.get(path)
            if data is None:
                self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}, head)
                return
            headers = {"X-Repo-Commit": hub.sha(repo, files), "ETag": f'"{_etag(data)}"',
                       "Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
            start = 0
            if (ranged := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))) is not None:
                start = int(ranged.group(1))
            body = data[start:]
            if head:
                self._send(200, b"", {**headers, "Content-Length": str(len(data))}, head=True)
                return
            hub.gets.append((f"{repo}/{path}", start))
            status = 206 if start else 200
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            cut = hub.cut_after is not None and f"{repo}/{path}" not in hub.cut and len(body) > hub.cut_after
            self.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(k, v)
            self.end_headers()
            if cut:  # a connection that breaks: the client keeps what came and resumes
                hub.cut.add(f"{repo}/{path}")
                self.wfile.write(body[:hub.cut_after])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _route(self, head: bool) -> None:
            if hub.outage is not None:
                hub.refused += 1
                self._send(hub.outage, b'{"error": "the Hub is down"}', {"Retry-After": "0"}, head)
                return
            path = unquote(self.path.split("?", 1)[0])
            if (api := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/((?:revision|tree)/.*))?", path)) is not None:
                return self._api(api.group(1), api.group(2) or "revision/main")
            if (resolve := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)) is not None:
                return self._file(resolve.group(1), resolve.group(2), resolve.group(3), head)
            self._send(404, b"", head=head)

        def do_GET(self) -> None:  # noqa: N802 (http.server's names)
            self._route(False)

        def do_HEAD(self) -> None:  # noqa: N802
            self._route(True)

    return Handler


@contextmanager
def hub_site(hub: Hub) -> Iterator[str]:
    """``hub`` served on a free loopback port; yields its URL (for ``HF_ENDPOINT``)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def folder_files(folder: Path) -> dict[str, bytes]:
    """A local model folder's files, as a repository's."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
