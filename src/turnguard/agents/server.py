"""The long-lived local process that answers hook events for ``client.py`` (started on demand).

Each connection is one event: a JSON header (the agent, the client's working directory and
environment) and the event's bytes, answered with the exit code, stdout and stderr that
``turnguard hook AGENT`` would give (``hook.run`` with the client's environment, so each event
reads its own configuration and state directory). The server keeps nothing a session needs: the
state is in the session's file, under the session's lock, as for the in-process hook, so its
death loses nothing. What it remembers (``hook.Memo``: each folder's settings, the state it last
wrote to each session's file) it uses only while the files it came from are unchanged. One
server per socket (a lock beside it); it exits after ``IDLE_S`` without events.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socketserver
import sys
import threading
import time

from turnguard.agents.client import frame, private_folder, read_frame
from turnguard.agents.hook import Memo, run

IDLE_S = 600.0


class _Handler(socketserver.StreamRequestHandler):
    server: Server

    def handle(self) -> None:
        self.server.touch()
        try:
            header = json.loads(read_frame(self.rfile, 1024 * 1024))
            event = read_frame(self.rfile)
            agent, env = header["agent"], header["env"]
            if not isinstance(agent, str) or not isinstance(env, dict):
                raise ValueError("a bad request")
        except (OSError, ValueError, KeyError, TypeError):
            return  # the client answers in a process of its own
        answer = run(agent, event, {str(k): str(v) for k, v in env.items()},
                     cwd=header.get("cwd") if isinstance(header.get("cwd"), str) else None, memo=self.server.memo)
        body = json.dumps({"exit": answer.exit_code, "stdout": answer.stdout_text(), "stderr": answer.stderr})
        with contextlib.suppress(OSError):
            self.wfile.write(frame(body.encode("utf-8", "surrogateescape")))
        self.server.touch()


class Server(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str) -> None:
        self.last = time.monotonic()
        self.memo = Memo.new()
        super().__init__(path, _Handler)
        os.chmod(path, 0o600)

    def touch(self) -> None:
        self.last = time.monotonic()

    def idle_watch(self, idle_s: float) -> None:
        while time.monotonic() - self.last < idle_s:
            time.sleep(min(idle_s, 5.0))
        self.shutdown()


def serve(path: str, idle_s: float = IDLE_S) -> int:
    """Serve on ``path`` until idle; 0 at once when another server holds it."""
    private_folder(path)
    lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a dead server's socket
    with Server(path) as server:
        threading.Thread(target=server.idle_watch, args=(idle_s,), daemon=True).start()
        server.serve_forever(poll_interval=1.0)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(lock)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m turnguard.agents serve SOCKET", file=sys.stderr)
        return 2
    return serve(argv[0])


