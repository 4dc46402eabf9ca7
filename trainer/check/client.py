"""An OpenAI-compatible endpoint over HTTP (stdlib only), every request bounded by one named timeout.

URL is the API's base as clients take it (http://host:port/v1) or the server's root (http://host:port): both reach
/v1/... and the root's extras (vLLM's /tokenize, llama-cpp-python's /extras/tokenize). A refused connection, an
unknown host or a request that gets no answer within --timeout is Unreachable (exit 2, naming the request and the
timeout); an HTTP error status is returned to the caller, which knows whether the server may lack that route.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from trainer.errors import ConfigError

API_KEY_ENV = "OPENAI_API_KEY"  # sent as a bearer token when set (vLLM's --api-key, a hosted endpoint); never shown


class Unreachable(ConfigError):
    """The endpoint cannot be reached or does not answer in time (exit 2)."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any  # the decoded JSON, or None


class Endpoint:
    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(f"check {url}: not an http(s) URL; give the API's base, e.g. http://127.0.0.1:8000/v1")
        if not timeout > 0:
            raise ConfigError(f"check --timeout {timeout}: give seconds above 0")
        self.root = url.rstrip("/").removesuffix("/v1")
        self.url = self.root + "/v1"
        self.timeout = timeout

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        """`path` under the root (/v1/models, /tokenize); Unreachable when no answer comes within the timeout."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if os.environ.get(API_KEY_ENV):
            headers["Authorization"] = f"Bearer {os.environ[API_KEY_ENV]}"
        request = urllib.request.Request(self.root + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return Answer(response.status, _decoded(response.read()))
        except urllib.error.HTTPError as exc:
            return Answer(exc.code, _decoded(exc.read()))
        except TimeoutError:
            raise Unreachable(f"check: {self.root} accepted {method} {path} but did not answer within "
                              f"{self.timeout:g} s (--timeout); is the server loaded, or hung?") from None  # fmt: skip
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            if isinstance(reason, TimeoutError):
                raise Unreachable(f"check: {self.root} did not answer {method} {path} within {self.timeout:g} s "
                                  "(--timeout); is the server loaded, or hung?") from None  # fmt: skip
            raise Unreachable(f"check: cannot reach {self.root} ({reason}); is the server running there? (python "
                              "-m trainer serve OUT prints its URL)") from None  # fmt: skip

    def post(self, path: str, body: dict[str, Any]) -> Answer:
        return self.request("POST", path, body)

    def required(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """A request the check cannot do without: its JSON, or Unreachable naming the status."""
        answer = self.request(method, path, body)
        if answer.status != 200 or not isinstance(answer.body, dict):
            detail = json.dumps(answer.body)[:300] if answer.body is not None else "no JSON"
            raise Unreachable(f"check: {method} {self.root}{path} answered HTTP {answer.status} ({detail}); is it an "
                              "OpenAI-compatible server?")  # fmt: skip
        return answer.body


def _decoded(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None
