"""An ASGI app on a real uvicorn, in a thread of the test process."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def uvicorn_thread(app: Any, **options: Any) -> Iterator[str]:
    """``app`` served by uvicorn (``options``: more of its ``Config``) on a free loopback port,
    in a daemon thread; yields its base URL and stops the server on exit.

    The socket listens before the server starts, so early requests wait in the backlog and no
    other process can take the port meanwhile."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", **options))
    sock = socket.create_server(("127.0.0.1", 0))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
