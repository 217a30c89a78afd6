"""``--live``: a run's (or comparison's, or sweep's) page, served on
127.0.0.1 while it goes on.

:func:`serving` starts the standard library's ``http.server`` in a daemon
thread for the length of a ``with`` block and stops it when the block ends,
however it ends. It serves two paths: ``/`` (the page's HTML, with its
script polling) and ``/data.json`` (the page's data, rebuilt from the
output directory's files when one of them changed). The data comes from the
files the run writes (rounds.parquet and clients.parquet, which the
recorder replaces atomically every few seconds; compare's and stress's
tables as each run ends), never from the process that runs the rounds: a
run on Ray workers and one in-process are served alike.

Nothing listens beyond the loopback interface. The port asked for being
taken is one line, and a free port is used instead (the address printed is
the one that serves). See docs/report-page.md.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from fedsim.tools.page_html import data_json, render

HOST = "127.0.0.1"
DEFAULT_PORT = 8765

# Builds a page's data from its output directory (fedsim.tools.page's
# run_page_data, fedsim.tools.page_group's group_page_data).
Build = Callable[[Path], dict[str, Any]]


class _Pages:
    """The served page and its data, rebuilt only when the files change.

    The files are stamped by (name, size, modification time) of every file
    in the directory and its ``runs/``: each writer replaces a file by
    renaming a new one over it, so a changed stamp is a new file whole.
    """

    def __init__(self, directory: Path, build: Build, waiting: str) -> None:
        """Args:
        directory: the output directory the run writes.
        build: its page's data.
        waiting: the page's title before the first rows are written.
        """
        self.directory, self.build, self.waiting = directory, build, waiting
        self.lock = threading.Lock()
        self.stamp: tuple[tuple[str, int, int], ...] | None = None
        self.json = ""

    def _stamp(self) -> tuple[tuple[str, int, int], ...]:
        files = [*self.directory.glob("*"), *self.directory.glob("runs/*")]
        stats = [(str(f), f.stat()) for f in files if f.is_file()]
        return tuple(sorted((n, s.st_size, s.st_mtime_ns) for n, s in stats))

    def data(self) -> str:
        """The page's data as JSON: rebuilt when the files changed; before
        the first rows, or while a file cannot be read yet, a page that
        says it waits (the next poll tries again)."""
        with self.lock:
            stamp = self._stamp()
            if stamp != self.stamp or not self.json:
                try:
                    content = self.build(self.directory)
                except (OSError, ValueError):  # ReportError: no rows yet
                    content = self._empty()
                self.json, self.stamp = data_json(content), stamp
            return self.json

    def _empty(self) -> dict[str, Any]:
        return {"title": self.waiting, "subtitle": str(self.directory),
                "counter_label": "rounds done", "counter": 0, "notes": [],
                "table": [], "sections": []}  # fmt: skip

    def page(self) -> str:
        """The HTML, with the data as it is now and polling on."""
        with self.lock:
            try:
                content = self.build(self.directory)
            except (OSError, ValueError):
                content = self._empty()
        return render(content, live=True)


def _handler(pages: _Pages) -> type[BaseHTTPRequestHandler]:
    """A request handler class serving ``pages`` (GET only; quiet log)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            path = self.path.split("?")[0]
            if path in ("/", "/index.html"):
                self._send(pages.page(), "text/html")
            elif path == "/data.json":
                self._send(pages.data(), "application/json")
            else:
                self.send_error(404)

        def _send(self, body: str, kind: str) -> None:
            raw = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", f"{kind}; charset=utf-8")
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("Cache-Control", "no-store")
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # a request line per second would bury the run's progress

    return Handler


def bind(port: int, say: Callable[[str], None]) -> ThreadingHTTPServer:
    """A server on 127.0.0.1: ``port``, or a free port when that is taken
    (said in one line).

    Args:
        port: the port asked for (0: any free one).
        say: prints one line to the user.

    Raises:
        OSError: not even a free port could be bound (no loopback).
    """
    try:
        return ThreadingHTTPServer((HOST, port), BaseHTTPRequestHandler)
    except OSError as exc:
        if port == 0:
            raise
        server = ThreadingHTTPServer((HOST, 0), BaseHTTPRequestHandler)
        free = server.server_address[1]
        say(f"live: port {port} on {HOST} is taken ({exc.strerror}); using {free}")
        return server


class LiveServer:
    """A page served from a daemon thread until :meth:`stop` (or the end of
    the ``with`` block it is used in, however the block ends).

    Attributes:
        url: the page's address, ``http://127.0.0.1:PORT/``.
    """

    def __init__(self, server: ThreadingHTTPServer, say: Callable[[str], None]):
        """Start serving (``server`` is bound and has its handler)."""
        self.server, self.say = server, say
        self.url = f"http://{HOST}:{server.server_address[1]}/"
        self.thread = threading.Thread(target=server.serve_forever, name="fedsim-live")
        self.thread.daemon = True  # never keeps a finished run's process alive
        self.thread.start()
        say(f"live: {self.url} (served while it runs)")

    def stop(self) -> None:
        """Stop serving and free the port (idempotent)."""
        if self.thread.is_alive():
            self.server.shutdown()
            self.thread.join()
            self.server.server_close()
            self.say(f"live: stopped serving {self.url}")

    def __enter__(self) -> LiveServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serving(
    directory: Path,
    build: Build,
    port: int = DEFAULT_PORT,
    say: Callable[[str], None] = print,
    waiting: str = "waiting for the first rows",
) -> LiveServer:
    """Serve ``directory``'s page from now until the server is stopped.

    The port is bound here, not when a ``with`` block is entered, so a
    caller can report a failure to bind before its work starts.

    Args:
        directory: the output directory (it may hold no rows yet).
        build: its page's data from its files.
        port: the port asked for; a taken one is replaced by a free one.
        say: prints the address (and a taken port) as one line each.
        waiting: the page's title until the first rows are written.

    Raises:
        OSError: no port could be bound on 127.0.0.1.
    """
    server = bind(port, say)
    server.RequestHandlerClass = _handler(_Pages(Path(directory), build, waiting))
    return LiveServer(server, say)
