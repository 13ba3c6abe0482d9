"""A local stand-in for the Hugging Face hub's download API, on 127.0.0.1.

It speaks the subset lobes.fleet.model_fetch uses, as the hub does:
- GET /api/models/{repo}/revision/{rev}?blobs=true: {id, sha, siblings: [{rfilename, size,
  blobId, lfs?: {sha256, size, pointerSize}}]}; an LFS file's blobId is its pointer's git id.
- GET /{repo}/resolve/{rev}/{path}: a plain file's bytes; an LFS file answers 302 to a second
  listener (the "CDN", another origin) that serves the blob. Both honour Range: bytes=N-.
- 401 without a token and 403 with a wrong one for a gated repo, 404 for an unknown repo,
  revision or file, with the hub's X-Error-Code header.
Fault knobs (cut a file after N bytes, serve a file's bytes wrong, slow a file down, answer a
Range with the whole file as a server without Range support does) and a log
of every request (which origin, its headers, the Range start and the bytes sent) are for tests.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt")


def git_blob_id(data: bytes) -> str:
    """The git object id of a blob holding data."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(data: bytes) -> bytes:
    """The git-lfs pointer file the repo holds in place of an LFS file."""
    oid = hashlib.sha256(data).hexdigest()
    spec = "version https://git-lfs.github.com/spec/v1"
    return f"{spec}\noid sha256:{oid}\nsize {len(data)}\n".encode()


@dataclass
class Commit:
    """One commit of a repo: its files, and which of them are LFS files."""

    sha: str
    files: dict[str, bytes]
    lfs: set[str]

    def sibling(self, path: str) -> dict:
        data = self.files[path]
        if path not in self.lfs:
            return {"rfilename": path, "size": len(data), "blobId": git_blob_id(data)}
        pointer = lfs_pointer(data)
        return {
            "rfilename": path,
            "size": len(data),
            "blobId": git_blob_id(pointer),
            "lfs": {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                    "pointerSize": len(pointer)},
        }


@dataclass
class Repo:
    """A repo: its commits in order (branch main is the last) and, when gated, its token."""

    commits: list[Commit] = field(default_factory=list)
    token: str | None = None

    def commit(self, rev: str) -> Commit | None:
        if rev == "main" and self.commits:
            return self.commits[-1]
        return next((c for c in self.commits if c.sha == rev), None)


@dataclass
class Request:
    """One request as a listener saw it."""

    origin: str  # "hub" or "cdn"
    path: str
    headers: dict[str, str]
    status: int = 0
    range_start: int | None = None
    bytes_sent: int = 0
    file: str | None = None


@dataclass
class Faults:
    """Per file faults: cut the connection after N bytes, serve wrong bytes, slow each chunk."""

    cut_after: dict[str, list[int]] = field(default_factory=dict)  # path -> cut points, once each
    corrupt: dict[str, int] = field(default_factory=dict)  # path -> times left (-1: always)
    delay: dict[str, float] = field(default_factory=dict)  # path -> seconds per chunk
    ignore_range: set[str] = field(default_factory=set)  # paths answered whole (200) to a Range
    echo_auth_in_errors: bool = False


class HubStandin:
    """The hub and its CDN: two ThreadingHTTPServers on `host` (127.0.0.1 unless a benchmark
gives its network namespace's address), in threads."""

    chunk = 4096

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.repos: dict[str, Repo] = {}
        self.faults = Faults()
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._blobs: dict[str, tuple[str, bytes]] = {}  # sha256 -> (path, data)
        self._servers = [ThreadingHTTPServer((host, 0), self._handler(origin))
                         for origin in ("hub", "cdn")]
        for server in self._servers:
            server.daemon_threads = True

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self._servers[0].server_port}"

    @property
    def cdn(self) -> str:
        return f"http://{self.host}:{self._servers[1].server_port}"

    def start(self) -> HubStandin:
        for server in self._servers:
            threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def add_commit(self, repo_id: str, files: dict[str, bytes], *, lfs: set[str] | None = None,
                   token: str | None = None) -> str:
        """Commit files (the whole tree) to repo_id, moving main to it; returns the commit sha.

        LFS files are those named in lfs, or by default the weight files (by suffix).
        """
        repo = self.repos.setdefault(repo_id, Repo())
        if token is not None:
            repo.token = token
        chosen = lfs if lfs is not None else {p for p in files if p.endswith(LFS_SUFFIXES)}
        seed = json.dumps([repo_id, len(repo.commits), sorted(
            (p, hashlib.sha256(d).hexdigest()) for p, d in files.items())]).encode()
        commit = Commit(hashlib.sha1(seed).hexdigest(), dict(files), set(chosen))
        repo.commits.append(commit)
        for path in commit.lfs:
            self._blobs[hashlib.sha256(files[path]).hexdigest()] = (path, files[path])
        return commit.sha

    def log(self, origin: str | None = None, file: str | None = None) -> list[Request]:
        """The requests seen, of one origin and for one file when given."""
        with self._lock:
            return [r for r in self.requests
                    if (origin is None or r.origin == origin) and (file is None or r.file == file)]

    def file_bytes_sent(self) -> int:
        """Bytes of file content sent by either listener."""
        return sum(r.bytes_sent for r in self.log() if r.file)

    def _handler(self, origin: str) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(_Handler):
            pass

        Handler.hub = hub
        Handler.origin = origin
        return Handler


class _Handler(BaseHTTPRequestHandler):
    hub: HubStandin
    origin: str
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: the tests read hub.requests instead."""

    def do_GET(self) -> None:
        record = Request(self.origin, self.path, dict(self.headers.items()))
        with self.hub._lock:
            self.hub.requests.append(record)
        url = urlsplit(self.path)
        if self.origin == "cdn":
            self._cdn(record, url.path)
        elif url.path.startswith("/api/models/"):
            self._info(record, url.path[len("/api/models/"):], parse_qs(url.query))
        elif "/resolve/" in url.path:
            self._resolve(record, url.path.lstrip("/"))
        else:
            self._error(record, 404, "EntryNotFound", "no such route")

    def _info(self, record: Request, rest: str, query: dict) -> None:
        repo_id, sep, rev = rest.partition("/revision/")
        if not sep:
            repo_id, rev = rest, "main"
        found = self._repo_commit(record, unquote(repo_id), unquote(rev))
        if found is None:
            return
        commit = found
        siblings = [commit.sibling(p) for p in sorted(commit.files)]
        if query.get("blobs") != ["true"]:
            siblings = [{"rfilename": s["rfilename"]} for s in siblings]
        self._json(record, 200, {"id": unquote(repo_id), "sha": commit.sha, "siblings": siblings})

    def _resolve(self, record: Request, rest: str) -> None:
        repo_id, _sep, tail = rest.partition("/resolve/")
        rev, _sep, path = tail.partition("/")
        commit = self._repo_commit(record, unquote(repo_id), unquote(rev))
        if commit is None:
            return
        path = unquote(path)
        record.file = path
        if path not in commit.files:
            self._error(record, 404, "EntryNotFound", f"{path} not in {repo_id}@{rev}")
        elif path in commit.lfs:
            oid = hashlib.sha256(commit.files[path]).hexdigest()
            record.status = 302
            self.send_response(302)
            self.send_header("Location", f"{self.hub.cdn}/repos/{oid}?name={quote(path)}")
            self.send_header("X-Repo-Commit", commit.sha)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send_file(record, path, commit.files[path])

    def _cdn(self, record: Request, path: str) -> None:
        blob = self.hub._blobs.get(path.rsplit("/", 1)[-1])
        if blob is None:
            self._error(record, 404, "EntryNotFound", "no such blob")
            return
        record.file = blob[0]
        self._send_file(record, *blob)

    def _repo_commit(self, record: Request, repo_id: str, rev: str) -> Commit | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(record, 404, "RepoNotFound", f"Repository {repo_id} not found")
            return None
        if repo.token is not None:
            auth = self.headers.get("Authorization")
            if auth is None:
                self._error(record, 401, "GatedRepo", f"Access to {repo_id} is restricted")
                return None
            if auth != f"Bearer {repo.token}":
                self._error(record, 403, "GatedRepo", f"Access to {repo_id} is not granted")
                return None
        commit = repo.commit(rev)
        if commit is None:
            self._error(record, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
        return commit

    def _send_file(self, record: Request, path: str, data: bytes) -> None:
        faults = self.hub.faults
        with self.hub._lock:
            if faults.corrupt.get(path, 0):
                faults.corrupt[path] -= 1 if faults.corrupt[path] > 0 else 0
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            cuts = faults.cut_after.get(path) or []
            cut = cuts.pop(0) if cuts else None
        start = None if path in faults.ignore_range else _range_start(self.headers.get("Range"))
        if start is not None and start >= len(data):
            self._error(record, 416, "RangeNotSatisfiable", "range past the end")
            return
        record.range_start = start
        body = data[start or 0:]
        record.status = 206 if start is not None else 200
        self.send_response(record.status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if start is not None:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        limit = len(body) if cut is None else max(0, cut - (start or 0))
        for offset in range(0, min(limit, len(body)), self.hub.chunk):
            piece = body[offset:min(offset + self.hub.chunk, limit)]
            self.wfile.write(piece)
            self.wfile.flush()
            record.bytes_sent += len(piece)
            if faults.delay.get(path):
                time.sleep(faults.delay[path])
        if cut is not None:
            self.close_connection = True

    def _error(self, record: Request, status: int, code: str, message: str) -> None:
        if self.hub.faults.echo_auth_in_errors:
            message += f" (you sent Authorization: {self.headers.get('Authorization')})"
        record.status = status
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, record: Request, status: int, payload: dict) -> None:
        record.status = status
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _range_start(header: str | None) -> int | None:
    """N of `bytes=N-`; None without a Range header (other forms are not asked by the module)."""
    if not header or not header.startswith("bytes=") or not header.endswith("-"):
        return None
    return int(header[len("bytes="):-1])
