"""``serve_in_thread(app)``: the server on a free loopback port in a background thread.

For tests and the reliability benchmarks, which drive a real uvicorn server over real sockets
from the same process (so they can also read its log and its objects). ``speclive serve`` runs
uvicorn in the foreground instead.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app: Any, log_level: str = "warning", **uvicorn_kw: Any) -> Iterator[str]:
    """Serve ``app`` on 127.0.0.1 until the block ends; yields the base URL."""
    import uvicorn

    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level=log_level, **uvicorn_kw)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True, name=f"uvicorn-{port}")
    thread.start()
    deadline = time.time() + 120
    while not server.started:
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
