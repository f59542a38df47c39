"""What an agent runs at each hook event: this file, as ``python -S -P -c LAUNCHER AGENT`` runs it
(``install.hook_command``).

A hook is a new process per event, before every tool call. Importing turnguard costs several
times what starting Python does, so this file is run by its path, with ``-S`` (not even
site-packages), and hands the event to a long-lived local process (``server``) over a Unix socket,
which answers as ``turnguard hook AGENT`` would. It imports only what a bare interpreter has
loaded already and two small C modules (``_socket``, a SHA-256): no ``json``, ``socket`` or
``subprocess`` (each costs more than starting the interpreter does), so the header and the answer
are frames of bytes, not JSON. The server starts on demand, keeps no state of its own (each
session's state is in its file, as for the in-process hook), and exits after ``server.IDLE_S``
without events; its death loses nothing.

When the server cannot answer (not started yet, gone, too slow, or broken), this event is
answered by ``python -m turnguard hook AGENT`` in a process of its own, and a server is started
for the next ones: every event gets turnguard's answer either way. A server that let an event wait
``ANSWER_TIMEOUT_S`` is wedged, and is ended first (``end_wedged_server``): else it would make
every later event wait as long.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # (importing ``typing`` costs a hook more than the rest of this file)
    from typing import Any

MAX_EVENT = 8 * 1024 * 1024 + 1
ANSWER_TIMEOUT_S = 25.0
"""How long the client waits for the server's answer (the agents' hook timeouts are 30 s as
installed) before answering in a process of its own."""
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_SOCKET_PATH = 100
"""A Unix socket's path must fit in 104 bytes (macOS; 108 on Linux)."""
AGENTS = ("claude-code", "codex", "gemini")
"""The agents ``turnguard hook`` answers (``hook.PROTOCOLS``' names, which a test holds equal): any
other argument is a command written wrong, which the server is not asked about."""
LENGTH_BYTES = 4
MAX_HEADER = 1024 * 1024


def _sha256() -> Any:
    """A SHA-256 object from the interpreter's own small module when it has one: ``hashlib``
    loads OpenSSL, a few milliseconds per hook."""
    for name in ("_sha256", "_sha2", "hashlib"):  # CPython 3.11; 3.12 and later; any
        try:
            return __import__(name).sha256()
        except (ImportError, AttributeError):
            continue
    raise ImportError("no SHA-256")


def socket_path() -> str:
    """The server's socket for this interpreter and this turnguard's code: another installation,
    or the code changed on disk, gets a server of its own. In a folder only this user may enter,
    with a short path (a socket's path has a length limit)."""
    stamp = _sha256()
    stamp.update(sys.executable.encode("utf-8", "surrogateescape"))
    for folder in (PACKAGE, os.path.join(PACKAGE, "agents"), os.path.join(PACKAGE, "policies")):
        try:
            for name in sorted(os.listdir(folder)):
                if name.endswith(".py"):
                    stamp.update(f"{folder}/{name}:{os.stat(os.path.join(folder, name)).st_mtime_ns}".encode(
                        "utf-8", "surrogateescape"))
        except OSError:
            continue
    name = os.path.join(f"turnguard-{os.getuid()}", f"{stamp.hexdigest()[:16]}.sock")
    for base in (os.environ.get("XDG_RUNTIME_DIR"), _temporary_folder(), "/tmp"):
        if base and os.path.isabs(base) and len(os.path.join(base, name)) <= MAX_SOCKET_PATH:
            return os.path.join(base, name)
    return os.path.join("/tmp", name)


def private_folder(path: str) -> None:
    """The socket's folder, made only this user's; ``OSError`` when it is someone else's or open
    to others (the events would be theirs to read or answer)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.lstat(folder)
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(folder) or os.path.islink(folder):
        raise OSError(f"{folder} is not a folder only this user can enter")


def _temporary_folder() -> str | None:
    """``tempfile.gettempdir``'s first choice, without importing it."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        folder = os.environ.get(name)
        if folder and os.path.isdir(folder):
            return os.path.abspath(folder)
    return None


def frame(data: bytes) -> bytes:
    """``data`` with its length before it (4 bytes, big-endian)."""
    return len(data).to_bytes(LENGTH_BYTES, "big") + data


def read_frame(stream: object, limit: int = MAX_EVENT) -> bytes:
    """One length-prefixed frame from a binary file object; ``OSError`` when it is cut short."""
    read = stream.read  # type: ignore[attr-defined]
    head = read(LENGTH_BYTES)
    if len(head) != LENGTH_BYTES:
        raise OSError("the frame's length was cut short")
    size = int.from_bytes(head, "big")
    if size > limit:
        raise OSError(f"a frame of {size} bytes is larger than {limit}")
    body = read(size)
    if len(body) != size:
        raise OSError("the frame was cut short")
    return bytes(body)


def header(agent: str) -> bytes:
    """The request's first frame: the agent, this folder, then each ``NAME=VALUE`` of the
    environment, apart by NUL bytes (which none of them can hold)."""
    environ = dict(os.environb)
    config = environ.get(b"TURNGUARD_CONFIG")
    if config and not os.path.isabs(config):
        environ[b"TURNGUARD_CONFIG"] = os.path.abspath(config)
    return b"\0".join([agent.encode(), os.getcwdb(), *(k + b"=" + v for k, v in environ.items())])


def read_header(data: bytes) -> tuple[str, str, dict[str, str]]:
    """``header``'s agent, folder and environment (as ``os.environ`` would hold them)."""
    agent, cwd, *pairs = data.split(b"\0")
    environ = {}
    for pair in pairs:
        name, sep, value = pair.partition(b"=")
        if not sep:
            raise ValueError("a variable without a value")
        environ[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return agent.decode("utf-8", "surrogateescape"), cwd.decode("utf-8", "surrogateescape"), environ


class _Reader:
    """``read(n)`` over a socket: exactly ``n`` bytes, or fewer when it closed."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock

    def read(self, size: int) -> bytes:
        parts = []
        while size > 0:
            part = self.sock.recv(min(size, 1 << 20))
            if not part:
                break
            parts.append(part)
            size -= len(part)
        return b"".join(parts)


Answer = tuple[int, bytes, bytes]
"""The exit code, stdout and stderr of ``turnguard hook AGENT``."""


def ask_server(path: str, agent: str, event: bytes) -> Answer:
    """The server's answer to ``event``; ``OSError`` (or ``ValueError``) when it has none."""
    import _socket

    request = frame(header(agent)) + frame(event)
    private_folder(path)
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        sock.settimeout(ANSWER_TIMEOUT_S)
        sock.connect(path)
        sock.sendall(request)
        reader = _Reader(sock)
        code, stdout, stderr = read_frame(reader, 16), read_frame(reader), read_frame(reader)
    finally:
        sock.close()
    return int(code), stdout, stderr


def start_server(path: str) -> None:
    """``python -m turnguard.agents serve PATH`` in a session of its own (it exits at once when
    another server holds the socket)."""
    import subprocess

    try:
        private_folder(path)
        subprocess.Popen([sys.executable, "-m", "turnguard.agents", "serve", path], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    except OSError:
        pass


def end_wedged_server(path: str) -> None:
    """End the server that holds ``path``'s lock after it let an event wait ``ANSWER_TIMEOUT_S``
    (stopped, deadlocked): it keeps nothing, and while it lives it holds every later event as
    long, the socket's lock (no other server can start) and any session lock it took. It is
    ended only while it holds the lock and is the process ``serve`` wrote there; returns once
    its lock is free (or after ``END_WAIT_S``), so that the server started next can take it."""
    import fcntl
    import signal
    import time

    try:
        fd = os.open(path + ".lock", os.O_RDWR)
    except OSError:
        return
    try:
        if _lock_free(fcntl, fd):
            return
        try:
            pid = int(os.pread(fd, 32, 0).decode("ascii") or "0")
        except (OSError, ValueError):
            return
        if pid <= 1 or pid == os.getpid() or not _serves(pid, path):
            return
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            return
        for _ in range(int(END_WAIT_S / 0.01)):
            if _lock_free(fcntl, fd):
                return
            time.sleep(0.01)
    finally:
        os.close(fd)


END_WAIT_S = 2.0
"""How long the client waits for an ended server's lock to be freed."""


def _lock_free(fcntl: Any, fd: int) -> bool:
    """Whether no process holds the lock on ``fd`` (taken and given back at once to tell)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    return True


def _serves(pid: int, path: str) -> bool:
    """Whether process ``pid`` is a server of ``path``: its command line names the socket, where
    the system shows it (``/proc``); elsewhere the lock's holder is taken at its word."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            arguments = f.read().split(b"\0")
    except FileNotFoundError:
        return not os.path.isdir("/proc/self")
    except OSError:
        return False
    return os.fsencode(path) in arguments


def answer_here(argv: list[str], event: bytes) -> Answer:
    """The answer of ``python -m turnguard hook ARGV`` (the agent) run for this event alone."""
    import subprocess

    done = subprocess.run([sys.executable, "-m", "turnguard", "hook", *argv], input=event, capture_output=True,
                          check=False)
    return done.returncode, done.stdout, done.stderr


def main(argv: list[str]) -> int:
    event = sys.stdin.buffer.read(MAX_EVENT)
    if len(argv) != 1 or argv[0] not in AGENTS:
        code, stdout, stderr = answer_here(argv, event)  # its usage error: said, counted, never a block
    else:
        path = socket_path()
        try:
            code, stdout, stderr = ask_server(path, argv[0], event)
        except TimeoutError:
            end_wedged_server(path)
            start_server(path)
            code, stdout, stderr = answer_here(argv, event)
        except (OSError, ValueError):
            start_server(path)
            code, stdout, stderr = answer_here(argv, event)
    sys.stdout.buffer.write(stdout)
    sys.stdout.buffer.flush()
    if stderr:
        sys.stderr.buffer.write(stderr)
        sys.stderr.buffer.flush()
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
