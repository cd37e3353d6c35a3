"""A Hugging Face hub-shaped HTTP server on 127.0.0.1 for ``codila pull`` tests (``HF_ENDPOINT``): the model
info API with file metadata, and ``resolve`` downloads with HEAD, ETag, X-Repo-Commit and byte ranges, as
``huggingface_hub`` calls them. It serves one repository from a local folder, and can misbehave on purpose:
gated (401 with ``X-Error-Code: GatedRepo``), a file whose bytes differ from its checksum, a connection
dropped once mid-file, slow chunks."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LFS_FROM = 1024  # files at least this large are served as LFS files (sha256 etag), the rest as git blobs


@dataclass
class FakeHub:
    folder: Path
    repo_id: str = "codila-test/tiny"
    commit: str = "c0ffee" * 6 + "c0ff"
    gated: bool = False
    corrupt: str | None = None  # a file served with one byte changed
    drop_once: str | None = None  # a file whose first download stops halfway
    delay: float = 0.0  # seconds between 64 KiB chunks
    ranges: list[str] = field(default_factory=list)  # every Range header a download sent
    downloads: list[str] = field(default_factory=list)
    tokens: set = field(default_factory=set)  # the Authorization headers requests carried

    def __post_init__(self) -> None:
        self.files = {p.name: p.read_bytes() for p in sorted(self.folder.iterdir()) if p.is_file()}
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_HEAD(self) -> None:
                hub._serve(self, body=False)

            def do_GET(self) -> None:
                hub._serve(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def meta(self, name: str) -> dict:
        data = self.files[name]
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        out = {"rfilename": name, "size": len(data), "blobId": blob}
        if len(data) >= LFS_FROM:
            out["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return out

    def _serve(self, h: BaseHTTPRequestHandler, *, body: bool) -> None:
        path = h.path.split("?")[0]
        self.tokens.add(h.headers.get("Authorization"))
        if self.gated:
            h.send_response(401)
            h.send_header("X-Error-Code", "GatedRepo")
            h.send_header("X-Error-Message", "Access to this model is restricted: accept its conditions")
            h.send_header("Content-Type", "application/json")
            raw = json.dumps({"error": "Access to this model is restricted"}).encode()
            h.send_header("Content-Length", str(len(raw)))
            h.end_headers()
            if body:
                h.wfile.write(raw)
            return
        api = f"/api/models/{self.repo_id}/revision/"
        if path.startswith(api):
            info = {"id": self.repo_id, "modelId": self.repo_id, "sha": self.commit, "private": False, "gated": False,
                    "siblings": [self.meta(n) for n in self.files], "tags": [], "downloads": 0, "likes": 0}
            return self._send(h, 200, json.dumps(info).encode(), body, {"Content-Type": "application/json"})
        prefix = f"/{self.repo_id}/resolve/"
        if not path.startswith(prefix):
            return self._send(h, 404, b'{"error": "not found"}', body, {"X-Error-Code": "EntryNotFound"})
        _, _, name = path[len(prefix):].partition("/")
        if name not in self.files:
            return self._send(h, 404, b'{"error": "entry not found"}', body, {"X-Error-Code": "EntryNotFound"})
        meta = self.meta(name)
        data = self.files[name]
        if name == self.corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        etag = meta["lfs"]["sha256"] if "lfs" in meta else meta["blobId"]
        headers = {"ETag": f'"{etag}"', "X-Repo-Commit": self.commit, "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if "lfs" in meta:
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))})
        start = 0
        rng = h.headers.get("Range")
        if body:
            self.downloads.append(name)
            if rng:
                self.ranges.append(f"{name} {rng}")
                start = int(rng.split("=")[1].split("-")[0])
        part = data[start:]
        h.send_response(206 if start else 200)
        for k, v in headers.items():
            h.send_header(k, v)
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(part)))
        h.end_headers()
        if not body:
            return
        # the drop comes near the end, after most of the file has reached the client
        cut = max(len(part) - 65536, len(part) // 2) if name == self.drop_once and not start else None
        if cut is not None:
            self.drop_once = None
        sent = 0
        for k in range(0, len(part), 65536):
            chunk = part[k : k + 65536]
            if cut is not None and sent + len(chunk) > cut:
                h.wfile.write(chunk[: cut - sent])
                h.wfile.flush()
                time.sleep(0.3)
                h.close_connection = True
                h.connection.shutdown(2)
                return
            h.wfile.write(chunk)
            sent += len(chunk)
            if self.delay:
                h.wfile.flush()
                time.sleep(self.delay)

    @staticmethod
    def _send(h: BaseHTTPRequestHandler, status: int, raw: bytes, body: bool, headers: dict) -> None:
        h.send_response(status)
        for k, v in headers.items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if body:
            h.wfile.write(raw)
