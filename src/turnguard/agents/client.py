"""The command an agent runs at each hook event: ``python -S .../turnguard/agents/client.py AGENT``.

A hook is a new process per event, before every tool call. Importing turnguard costs several
times what starting Python does, so this file imports only the standard library (it is run by
path, with ``-S``: not even site-packages) and hands the event to a long-lived local process
(``server``) over a Unix socket, which answers as ``turnguard hook AGENT`` would. The server
starts on demand, keeps no state of its own (each session's state is in its file, as for the
in-process hook), and exits after ``server.IDLE_S`` without events; its death loses nothing.

When the server cannot answer (not started yet, gone, too slow, or broken), this event is
answered by ``python -m turnguard hook AGENT`` in a process of its own, and a server is started
for the next ones: every event gets turnguard's answer either way.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile

MAX_EVENT = 8 * 1024 * 1024 + 1
ANSWER_TIMEOUT_S = 25.0
"""How long the client waits for the server's answer (the agents' hook timeouts are 30 s as
installed) before answering in a process of its own."""
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_FRAME = struct.Struct(">I")
MAX_SOCKET_PATH = 100
"""A Unix socket's path must fit in 104 bytes (macOS; 108 on Linux)."""


def socket_path() -> str:
    """The server's socket for this interpreter and this turnguard's code: another installation,
    or the code changed on disk, gets a server of its own. In a folder only this user may enter,
    with a short path (a socket's path has a length limit)."""
    stamp = hashlib.sha256(sys.executable.encode("utf-8", "surrogateescape"))
    for folder in (PACKAGE, os.path.join(PACKAGE, "agents"), os.path.join(PACKAGE, "policies")):
        try:
            for name in sorted(os.listdir(folder)):
                if name.endswith(".py"):
                    stamp.update(f"{folder}/{name}:{os.stat(os.path.join(folder, name)).st_mtime_ns}".encode(
                        "utf-8", "surrogateescape"))
        except OSError:
            continue
    name = os.path.join(f"turnguard-{os.getuid()}", f"{stamp.hexdigest()[:16]}.sock")
    for base in (os.environ.get("XDG_RUNTIME_DIR"), tempfile.gettempdir(), "/tmp"):
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


def frame(data: bytes) -> bytes:
    """``data`` with its length before it (4 bytes, big-endian)."""
    return _FRAME.pack(len(data)) + data


def read_frame(stream: object, limit: int = MAX_EVENT) -> bytes:
    """One length-prefixed frame from a binary file object; ``OSError`` when it is cut short."""
    read = stream.read  # type: ignore[attr-defined]
    head = read(_FRAME.size)
    if len(head) != _FRAME.size:
        raise OSError("the frame's length was cut short")
    (size,) = _FRAME.unpack(head)
    if size > limit:
        raise OSError(f"a frame of {size} bytes is larger than {limit}")
    body = read(size)
    if len(body) != size:
        raise OSError("the frame was cut short")
    return bytes(body)


def ask_server(path: str, agent: str, event: bytes) -> dict[str, object]:
    """The server's answer to ``event``; ``OSError`` (or ``ValueError``) when it has none."""
    environ = dict(os.environ)
    config = environ.get("TURNGUARD_CONFIG")
    if config and not os.path.isabs(config):
        environ["TURNGUARD_CONFIG"] = os.path.abspath(config)
    header = json.dumps({"agent": agent, "cwd": os.getcwd(), "env": environ}).encode("utf-8", "surrogateescape")
    private_folder(path)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(ANSWER_TIMEOUT_S)
        sock.connect(path)
        sock.sendall(frame(header) + frame(event))
        with sock.makefile("rb") as stream:
            answer = json.loads(read_frame(stream))
    if not isinstance(answer, dict) or not isinstance(answer.get("exit"), int):
        raise ValueError("the server's answer is not one")
    return answer


def start_server(path: str) -> None:
    """``python -m turnguard.agents serve PATH`` in a session of its own (it exits at once when
    another server holds the socket)."""
    try:
        private_folder(path)
        subprocess.Popen([sys.executable, "-m", "turnguard.agents", "serve", path], stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                         close_fds=True)
    except OSError:
        pass


def answer_here(agent: str, event: bytes) -> dict[str, object]:
    """The answer of ``python -m turnguard hook AGENT`` run for this event alone."""
    done = subprocess.run([sys.executable, "-m", "turnguard", "hook", agent], input=event, capture_output=True,
                          check=False)
    return {"exit": done.returncode, "stdout": done.stdout.decode("utf-8", "replace"),
            "stderr": done.stderr.decode("utf-8", "replace")}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("turnguard hook: usage: client.py AGENT (the event on stdin)\n")
        return 2
    event = sys.stdin.buffer.read(MAX_EVENT)
    path = socket_path()
    try:
        answer = ask_server(path, argv[0], event)
    except (OSError, ValueError):
        start_server(path)
        answer = answer_here(argv[0], event)
    sys.stdout.write(str(answer.get("stdout") or ""))
    sys.stdout.flush()
    if answer.get("stderr"):
        sys.stderr.write(str(answer["stderr"]))
    code = answer["exit"]
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
