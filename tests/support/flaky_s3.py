"""A flaky bucket: an HTTP proxy in front of the local S3 server (tests/support/s3.py) that
answers a share of the requests with S3's throttling error (503 SlowDown) instead of passing
them on. Failures come in bursts (`fail` requests in a row after every `ok` passed on; with
`once`, one burst only), so a burst can outlast the AWS SDK's own attempts (pyarrow's S3 client
retried a 503 about 30 times over ~6 s here), deterministically; `on=False` passes all."""

from __future__ import annotations

import contextlib
import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")


class FlakyProxy:
    def __init__(self, upstream: str, ok: int, fail: int, once: bool = False) -> None:
        self.upstream, self.ok, self.fail, self.once = upstream, ok, fail, once
        self.on, self.count, self.failed = True, 0, 0
        self.lock = threading.Lock()

    def should_fail(self) -> bool:
        with self.lock:
            self.count += 1
            index, period = self.count - 1, self.ok + self.fail
            failing = self.on and index % period >= self.ok and not (self.once and index >= period)
            self.failed += failing
            return failing


def _handler(proxy: FlakyProxy) -> type:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if proxy.should_fail():
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(SLOW_DOWN)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(SLOW_DOWN)
                return
            host, port = proxy.upstream.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
            headers["Host"] = proxy.upstream
            conn.request(self.command, self.path, body=body, headers=headers)
            answer = conn.getresponse()
            data = answer.read()
            self.send_response(answer.status, answer.reason)
            head = self.command == "HEAD"  # its Content-Length is the object's: kept
            for k, v in answer.getheaders():
                if k.lower() not in ("transfer-encoding", "connection") and (
                        head or k.lower() != "content-length"):
                    self.send_header(k, v)
            if not head:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any

    return Handler


@contextlib.contextmanager
def flaky_proxy(upstream: str, ok: int = 3, fail: int = 4,
                once: bool = False) -> Iterator[tuple[str, FlakyProxy]]:
    """(`host:port` of the proxy, its state) for the S3 server at `upstream` (`host:port`)."""
    proxy = FlakyProxy(upstream, ok, fail, once)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(proxy))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", proxy
    finally:
        server.shutdown()
        server.server_close()
