"""The kubelet's API client: plain HTTPS with the node's token (urllib, no typed models)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


class Api:
    def __init__(self, server: str, token: str, ca_file: Path) -> None:
        self.server, self.token = server, token
        self.ctx = ssl.create_default_context(cafile=str(ca_file))

    def request(self, method: str, path: str, body: Any = None, *, query: dict | None = None,
                content_type: str = "application/json", timeout: float = 30) -> Any:
        url = self.server + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self.token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            text = e.read()
            try:
                message = json.loads(text).get("message", text.decode())
            except ValueError:
                message = text.decode(errors="replace")
            raise ApiError(e.code, message) from None
        except (urllib.error.URLError, OSError) as e:
            raise ApiError(0, str(e)) from None
        return json.loads(text) if text else {}

    def get(self, path: str, **query: Any) -> Any:
        return self.request("GET", path, query=query or None)

    def find(self, path: str) -> dict | None:
        try:
            return self.get(path)
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    def items(self, path: str, **query: Any) -> list[dict]:
        return self.get(path, **query).get("items") or []

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)
