"""A stand-in for the Hugging Face Hub (a third party the tests may not reach): the endpoints huggingface_hub's
snapshot_download and hf_hub_download call, served from memory on 127.0.0.1 by http.server in a thread.

    GET  /api/{models|datasets}/{repo}/revision/{rev}   repo info: {"id", "sha", "siblings"}
    GET  /api/{models|datasets}/{repo}/tree/{sha}       the file listing (recursive)
    HEAD/GET /[datasets/]{repo}/resolve/{rev}/{path}    a file, with X-Repo-Commit and ETag

and what huggingface_hub's create_repo, create_branch and upload_folder call (huggingface_hub 2.4 and 0.36), for
tokens in `server.write_tokens`:

    POST /api/repos/create                              {"name", "organization", "visibility"|"private"}
    POST /api/models/{repo}/branch/{branch}             a branch from main
    POST /api/validate-yaml                             README.md's metadata (accepted)
    POST /api/models/{repo}/preupload/{rev}             every file "regular" (its bytes go in the commit)
    POST /api/models/{repo}/commit/{rev}                ndjson: a header, then base64 files; a new commit on rev

Errors as the Hub answers them: an unknown repository is 404 with `X-Error-Code: RepoNotFound`, a gated one 401 with
`X-Error-Code: GatedRepo` unless the request carries the accepted token, an unknown revision 404 with
`X-Error-Code: RevisionNotFound`. Point the library at it with HF_ENDPOINT=server.url. Every request is logged
(`server.requests`), so a test can prove that an offline run asked nothing. `server.commits_open` cleared holds
every commit request (before its body is read) until it is set: pushes in flight, for the tests.
"""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


@dataclass
class Repo:
    """One repository: its commits (sha -> {path: bytes}) and branches (name -> sha)."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    gated_token: str | None = None  # set: only requests with this bearer token may read it
    private: bool = False  # only write tokens see it (others get 404, as on the Hub)
    refused_tokens: tuple[str, ...] = ()  # tokens answered 401 "Invalid credentials" (expired, revoked)

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        """Add a commit with `files` on `branch`; returns its sha."""
        digest = hashlib.sha1(json.dumps(sorted((p, hashlib.sha1(b).hexdigest()) for p, b in files.items())).encode())
        digest.update(str(len(self.commits)).encode())
        sha = digest.hexdigest()
        self.commits[sha] = dict(files)
        self.refs[branch] = sha
        return sha


def folder_files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def populate_cache(hf_home: Path, repo_id: str, files: dict[str, bytes], sha: str, branch: str = "main",
                   kind: str = "models") -> Path:  # fmt: skip
    """Write `files` into HF_HOME/hub in huggingface_hub's own layout (what a copied cache looks like): blobs named
    by content hash, snapshots/<sha>/ of relative symlinks to them, refs/<branch> holding the sha."""
    import os

    root = hf_home / "hub" / f"{kind}--{repo_id.replace('/', '--')}"
    snapshot = root / "snapshots" / sha
    for path, data in files.items():
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / path
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / branch).write_text(sha)
    return snapshot


class HubServer:
    def __init__(self) -> None:
        self.repos: dict[tuple[str, str], Repo] = {}  # (models|datasets, org/name) -> Repo
        self.requests: list[str] = []
        self.write_tokens: set[str] = set()  # bearer tokens that may create repositories and commit
        self.commits_open = threading.Event()  # cleared: a commit request waits (logged) until it is set again
        self.commits_open.set()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def repo(self, repo_id: str, kind: str = "models") -> Repo:
        return self.repos.setdefault((kind, repo_id), Repo())

    def start(self) -> HubServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: requests are kept in hub.requests
            pass

        def do_HEAD(self) -> None:
            self._serve(body=False)

        def do_GET(self) -> None:
            self._serve(body=True)

        def do_POST(self) -> None:
            hub.requests.append(f"POST {self.path}")
            parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
            if parts[4:5] == ["commit"]:
                hub.commits_open.wait()
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if parts == ["api", "validate-yaml"]:
                self._send(200, {"errors": [], "warnings": []}, True)
            elif not self._may_write():
                return
            elif parts == ["api", "repos", "create"]:
                self._create(json.loads(data))
            elif parts[:2] == ["api", "models"] and len(parts) >= 6:
                self._write("/".join(parts[2:4]), parts[4], "/".join(parts[5:]), data)
            else:
                self._send(404, {"error": "unknown endpoint"}, True, {"X-Error-Code": "EntryNotFound"})

        def _may_write(self) -> bool:
            token = self.headers.get("Authorization", "").removeprefix("Bearer ")
            if not token:
                self._send(401, {"error": "Invalid username or password."}, True)
            elif token not in hub.write_tokens:
                self._send(403, {"error": "You don't have the rights to write in this namespace"}, True)
            return token in hub.write_tokens

        def _create(self, payload: dict) -> None:
            repo_id = f"{payload['organization']}/{payload['name']}"
            if ("models", repo_id) in hub.repos:
                self._send(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo_id}"}, True)
                return
            private = payload.get("visibility") == "private" or bool(payload.get("private"))
            repo = hub.repo(repo_id)
            repo.private = private
            repo.commit({".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"})
            self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id}, True)

        def _write(self, repo_id: str, what: str, revision: str, data: bytes) -> None:
            repo = hub.repos.get(("models", repo_id))
            if repo is None:
                self._send(404, {"error": "Repository not found"}, True, {"X-Error-Code": "RepoNotFound"})
            elif what == "preupload":
                files = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                         for f in json.loads(data)["files"]]  # fmt: skip
                self._send(200, {"files": files, "commitOid": repo.refs.get(revision)}, True)
            elif what == "branch":
                if revision in repo.refs:
                    self._send(409, {"error": "Reference already exists"}, True)
                else:
                    repo.refs[revision] = repo.refs["main"]
                    self._send(200, {}, True)
            elif what == "commit" and revision in repo.refs:
                files = dict(repo.commits[repo.refs[revision]])
                for line in data.splitlines():
                    entry = json.loads(line)
                    if entry["key"] == "file":
                        files[entry["value"]["path"]] = base64.b64decode(entry["value"]["content"])
                sha = repo.commit(files, branch=revision)
                self._send(200, {"commitUrl": f"{hub.url}/{repo_id}/commit/{sha}", "commitOid": sha,
                                 "pullRequestUrl": None}, True)  # fmt: skip
            else:
                self._send(404, {"error": "Invalid rev id"}, True, {"X-Error-Code": "RevisionNotFound"})

        def _serve(self, body: bool) -> None:
            hub.requests.append(f"{self.command} {self.path}")
            parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
            if parts[:1] == ["api"] and len(parts) >= 6:
                self._api(parts[1], "/".join(parts[2:4]), parts[4], "/".join(parts[5:]), body)
            elif "resolve" in parts:
                at = parts.index("resolve")
                kind = "datasets" if parts[0] == "datasets" else "models"
                repo_id = "/".join(parts[1:at] if kind == "datasets" else parts[:at])
                self._file(kind, repo_id, parts[at + 1], "/".join(parts[at + 2 :]), body)
            else:
                self._send(404, {"error": "unknown endpoint"}, body, {"X-Error-Code": "EntryNotFound"})

        def _lookup(self, kind: str, repo_id: str, revision: str, body: bool) -> tuple[Repo, str] | None:
            repo = hub.repos.get((kind, repo_id))
            if repo is None:
                self._send(404, {"error": "Repository not found"}, body, {"X-Error-Code": "RepoNotFound"})
                return None
            if self.headers.get("Authorization", "").removeprefix("Bearer ") in repo.refused_tokens:
                self._send(401, {"error": "Invalid credentials"}, body,
                           {"X-Error-Message": "Invalid credentials in Authorization header"})  # fmt: skip
                return None
            if repo.private and self.headers.get("Authorization", "").removeprefix("Bearer ") not in hub.write_tokens:
                self._send(404, {"error": "Repository not found"}, body, {"X-Error-Code": "RepoNotFound"})
                return None
            if repo.gated_token and self.headers.get("Authorization") != f"Bearer {repo.gated_token}":
                self._send(401, {"error": "Access to this model is restricted"}, body, {"X-Error-Code": "GatedRepo"})
                return None
            sha = repo.refs.get(revision, revision if revision in repo.commits else None)
            if sha is None:
                self._send(404, {"error": "Invalid rev id"}, body, {"X-Error-Code": "RevisionNotFound"})
                return None
            return repo, sha

        def _api(self, kind: str, repo_id: str, what: str, revision: str, body: bool) -> None:
            found = self._lookup(kind, repo_id, revision, body)
            if found is None:
                return
            repo, sha = found
            files = repo.commits[sha]
            if what == "revision":
                siblings = [{"rfilename": p} for p in files]
                self._send(200, {"id": repo_id, "sha": sha, "siblings": siblings, "private": False}, body)
            elif what == "tree":
                entries = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                           for p, b in files.items()]  # fmt: skip
                self._send(200, entries, body)
            else:
                self._send(404, {"error": "unknown endpoint"}, body, {"X-Error-Code": "EntryNotFound"})

        def _file(self, kind: str, repo_id: str, revision: str, path: str, body: bool) -> None:
            found = self._lookup(kind, repo_id, revision, body)
            if found is None:
                return
            repo, sha = found
            data = repo.commits[sha].get(path)
            if data is None:
                self._send(404, {"error": "Entry not found"}, body, {"X-Error-Code": "EntryNotFound"})
                return
            headers = {"X-Repo-Commit": sha, "ETag": f'"{hashlib.sha1(data).hexdigest()}"'}
            self._send(200, data, body, headers)

        def _send(self, status: int, payload: object, body: bool, headers: dict[str, str] | None = None) -> None:
            data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream" if isinstance(payload, bytes)
                             else "application/json")  # fmt: skip
            self.end_headers()
            if body:
                self.wfile.write(data)

    return Handler
