"""The long-lived local process that answers hook events for ``client.py`` (started on demand).

Each connection is one event: a header (the agent, the client's working directory and
environment: ``client.header``) and the event's bytes (the client's process, which the agent
started, is the socket's peer), answered with the exit code, stdout and
stderr (three frames) that
``turnguard hook AGENT`` would give (``hook.run`` with the client's environment, so each event
reads its own configuration and state directory). The server keeps nothing a session needs: the
state is in the session's file, under the session's lock, as for the in-process hook, so its
death loses nothing. What it remembers (``hook.Memo``: each folder's settings, the state it last
wrote to each session's file) it uses only while the files it came from are unchanged. One
server per socket (a lock beside it, which holds its process id); it exits after ``IDLE_S``
without events, or is ended by a client it let wait too long (``client.end_wedged_server``).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import socketserver
import struct
import sys
import threading
import time

from turnguard.agents.client import MAX_HEADER, frame, private_folder, read_frame, read_header
from turnguard.agents.hook import PROTOCOLS, Memo, run

IDLE_S = 600.0


class _Handler(socketserver.StreamRequestHandler):
    server: Server

    def handle(self) -> None:
        self.server.touch()
        try:
            agent, cwd, env = read_header(read_frame(self.rfile, MAX_HEADER))
            event = read_frame(self.rfile)
        except (OSError, ValueError):
            return  # the client answers in a process of its own
        if agent not in PROTOCOLS:
            return  # (and says how to use it)
        answer = run(agent, event, env, cwd=cwd or None, memo=self.server.memo, caller=client_pid(self.request))
        reply = b"".join(frame(part.encode("utf-8", "surrogateescape"))
                         for part in (str(answer.exit_code), answer.stdout_text(), answer.stderr))
        with contextlib.suppress(OSError):
            self.wfile.write(reply)
        self.server.touch()


def client_pid(connection: socket.socket) -> int | None:
    """The process at the other end of ``connection`` (the hook's client), where the system says
    (Linux); ``None`` elsewhere."""
    option = getattr(socket, "SO_PEERCRED", None)
    if option is None:
        return None
    try:
        credentials = connection.getsockopt(socket.SOL_SOCKET, option, PEER_CREDENTIALS.size)
    except OSError:
        return None
    pid: int = PEER_CREDENTIALS.unpack(credentials)[0]
    return pid or None


PEER_CREDENTIALS = struct.Struct("3i")
"""``struct ucred``: the peer's pid, uid and gid."""


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
    os.ftruncate(lock, 0)
    os.pwrite(lock, str(os.getpid()).encode("ascii"), 0)  # (a client ends a wedged server by it)
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


