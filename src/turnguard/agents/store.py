"""Each session's turn state between hook processes: one JSON file per session, locked, replaced whole.

Every hook event is a fresh process, and an agent runs the hooks of parallel tool calls at once.
So a session's state is read, changed and written under an exclusive ``flock`` on a lock file
beside it (parallel hooks take turns; a killed holder's lock is released by the kernel), and
written to a temporary file that then replaces the state (``os.replace``): a hook killed at any
point leaves the last state written whole. Two sessions never share a file. Files of sessions not
touched for ``MAX_AGE_S`` are removed when a turn starts, but never one that still holds a turn
(``stale`` hands such a turn to the outbox first); a state larger than ``MAX_STATE_BYTES`` is
refused (the hook fails open), which the live bounds of a turn keep far away.

No ``fsync``: the state survives the death of any process (a kill at any point, the server's
included), which is what a hook's guarantee is about; a power loss within the kernel's writeback
delay may lose the last states of a session, which then goes on with a new turn (the damaged
file set aside, the hook failing open). A flush to disk at every tool call would cost more than
the rest of the event. The long-lived server (``Written``) also swaps the new file in with Linux's
``renameat2(RENAME_EXCHANGE)`` where it can: still one atomic step, but ext4 starts no writeback
of the new file then, as it does for a rename over an existing file (milliseconds on a busy disk),
and it reads a session's file again only when it changed since it wrote it.

Where: ``$TURNGUARD_STATE_DIR``, else ``$XDG_STATE_HOME/turnguard``, else
``~/.local/state/turnguard``; the sessions of an agent under ``hooks/AGENT/``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

MAX_STATE_BYTES = 16 * 1024 * 1024
MAX_AGE_S = 7 * 24 * 3600
LOCK_TIMEOUT_S = 20.0
"""How long a hook waits for the session's lock before it gives up (and fails open)."""
STATE_VERSION = 1


class StoreError(OSError):
    """The session's state cannot be read, locked or written (the hook fails open, saying why)."""


def state_root(environ: Mapping[str, str] | None = None) -> Path:
    """The user's turnguard state directory (see the module's docstring)."""
    env = os.environ if environ is None else environ
    explicit = env.get("TURNGUARD_STATE_DIR")
    if explicit:
        return Path(explicit)
    xdg = env.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path(env.get("HOME") or Path.home()) / ".local" / "state"
    return base / "turnguard"


def session_file_name(session_id: str) -> str:
    """A file name for any session id (ids are the agent's: never trusted as a path)."""
    return hashlib.sha256(session_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


class SessionStore:
    """The sessions of one agent under ``root/hooks/AGENT``."""

    def __init__(self, root: Path, agent: str, written: Written | None = None) -> None:
        self.directory = root / "hooks" / agent
        self.written = written

    def path(self, session_id: str) -> Path:
        return self.directory / f"{session_file_name(session_id)}.json"

    def locked(self, session_id: str, timeout_s: float = LOCK_TIMEOUT_S) -> contextlib.AbstractContextManager[Session]:
        """The session's state, held exclusively until the block ends; ``Session.save`` writes it."""
        return self.locked_file(session_file_name(session_id), timeout_s, session_id)

    def session_names(self) -> list[str]:
        """The names of the sessions' files (``session_file_name``), for ``locked_file``."""
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return []
        return [e.name[:-5] for e in entries if e.name.endswith(".json") and not e.name.startswith(".")]

    @contextlib.contextmanager
    def locked_file(self, name: str, timeout_s: float = LOCK_TIMEOUT_S, session_id: str = "") -> Iterator[Session]:
        """``locked`` for the session whose file is ``NAME.json`` (its id unknown: ``session_names``);
        ``StoreError`` when its lock is held for ``timeout_s`` (0: at once)."""
        lock = self.directory / f"{name}.lock"
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
                fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                raise StoreError(exc.errno, f"cannot open the session lock in {self.directory}: "
                                            f"{exc.strerror}") from None
            try:
                _lock(fd, max(0.0, deadline - time.monotonic()), timeout_s)
            except BaseException:
                os.close(fd)
                raise
            if _same_file(fd, lock):
                break
            os.close(fd)  # ``clean`` removed it between our open and our lock: take the new one
        try:
            with contextlib.suppress(OSError):
                os.utime(fd)  # in use: ``clean`` goes by this time
            yield Session(self.directory / f"{name}.json", session_id, self.written)
        finally:
            os.close(fd)  # releases the lock

    def clean(self, now: float | None = None, max_age_s: float = MAX_AGE_S) -> int:
        """Remove the files of sessions untouched for ``max_age_s`` (and temporary files a killed
        hook left); returns how many files went. Never raises: a file in use stays, and so does a
        session's file that still holds a turn (``holds_turn``): its journal is not exported yet."""
        now = time.time() if now is None else now
        removed = 0
        try:
            entries = list(os.scandir(self.directory))
        except OSError:
            return 0
        for entry in entries:
            try:
                old = now - entry.stat().st_mtime > (60 if entry.name.startswith(".") else max_age_s)
                if old and entry.is_file() and not (entry.name.endswith(".json") and holds_turn(entry.path)):
                    removed += _remove_lock(entry.path) if entry.name.endswith(".lock") else _unlink(entry.path)
            except OSError:
                continue
        return removed


def holds_turn(path: str) -> bool:
    """Whether a session's file holds a turn (open, or stopped and not yet handed over); a file
    that cannot be read as a state holds none."""
    try:
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_STATE_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("turn") is not None


def _unlink(path: str) -> int:
    os.unlink(path)
    return 1


def _remove_lock(path: str) -> int:
    """A session's lock file, unless a hook holds it: removed while held here, so a hook that
    opened it meanwhile finds it gone once it has the lock, and opens the new one (``locked``)."""
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0
    else:
        os.unlink(path)
        return 1
    finally:
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except OSError:
        return False


def _lock(fd: int, timeout_s: float, said_s: float | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    delay = 0.0005
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise StoreError(0, f"the session's lock was held for more than {said_s or timeout_s:g} s") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.02)


Identity = tuple[int, int, int, int, int]
"""A file's device, inode, size, modification and change times: any write by another process
changes one of them (a replaced file is a new inode)."""


def _identity(st: os.stat_result) -> Identity:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class Written:
    """The state a long-lived process (the server) last wrote to each session's file, with the
    file's identity then: the next event of the session, under its lock, takes it instead of
    reading and parsing the file when the file is still that one. Bounded in sessions and in
    the states' size as written (the oldest go first); thread-safe."""

    def __init__(self, limit: int = 256, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.limit = limit
        self.max_bytes = max_bytes
        self._states: OrderedDict[Path, tuple[Identity, dict[str, Any]]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def take(self, path: Path) -> dict[str, Any] | None:
        """The state written to ``path``, if it is still there (given away: the caller changes it)."""
        with self._lock:
            kept = self._pop(path)
        if kept is None:
            return None
        try:
            same = _identity(os.stat(path)) == kept[0]
        except OSError:
            return None
        return kept[1] if same else None

    def put(self, path: Path, identity: Identity, data: dict[str, Any]) -> None:
        with self._lock:
            self._pop(path)
            if identity[2] > self.max_bytes:
                return
            self._states[path] = (identity, data)
            self._bytes += identity[2]
            while len(self._states) > self.limit or self._bytes > self.max_bytes:
                self._pop(next(iter(self._states)))

    def drop(self, path: Path) -> None:
        with self._lock:
            self._pop(path)

    def _pop(self, path: Path) -> tuple[Identity, dict[str, Any]] | None:
        kept = self._states.pop(path, None)
        if kept is not None:
            self._bytes -= kept[0][2]
        return kept


class Session:
    """One session's state while its lock is held: ``data`` read on first use, ``save`` to write."""

    def __init__(self, path: Path, session_id: str, written: Written | None = None) -> None:
        self.path = path
        self.session_id = session_id
        self.written = written
        self._data: dict[str, Any] | None = None

    @property
    def data(self) -> dict[str, Any]:
        if self._data is None:
            kept = self.written.take(self.path) if self.written is not None else None
            self._data = kept if kept is not None else self._read()
        return self._data

    def _read(self) -> dict[str, Any]:
        try:
            with open(self.path, "rb") as f:
                raw = f.read(MAX_STATE_BYTES + 1)
        except FileNotFoundError:
            return {"version": STATE_VERSION}
        except OSError as exc:
            raise StoreError(exc.errno, f"cannot read {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(raw) if len(raw) <= MAX_STATE_BYTES else None
        except (ValueError, RecursionError):  # (nested deeper than this process can parse)
            data = None
        if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
            self._set_aside()
            what = (f"larger than {MAX_STATE_BYTES} bytes" if len(raw) > MAX_STATE_BYTES
                    else f"not a turnguard session state of version {STATE_VERSION}")
            raise StoreError(0, f"{self.path} is {what} (set aside as {self.path.name}.bad; the session goes on "
                                f"with a new turn)")
        return data

    def _set_aside(self) -> None:
        """A state this version cannot read goes out of the way (kept for a look), so that the
        session's next event starts afresh instead of failing on it again."""
        if self.written is not None:
            self.written.drop(self.path)
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_name(self.path.name + ".bad"))

    def set_aside(self) -> str:
        """Put the state's file out of the way as damaged (kept for a look, as ``NAME.bad``) and
        empty ``data`` in place: the caller goes on with a new turn. Returns the name it has now."""
        self._set_aside()
        data = self.data
        data.clear()
        data["version"] = STATE_VERSION
        return self.path.name + ".bad"

    def save(self) -> None:
        """Write the state whole: to a temporary file, then put in place of the last one in one
        step (``os.replace``, or the server's swap). ``data`` is not to be changed after it."""
        data = self.data
        text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
        body = text.encode("utf-8", "surrogatepass")
        if len(body) > MAX_STATE_BYTES:
            raise StoreError(0, f"the session's state would be larger than {MAX_STATE_BYTES} bytes")
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(body)
            swapped = self.written is not None and _swap(tmp, self.path)
            if not swapped:
                os.replace(tmp, self.path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise StoreError(exc.errno, f"cannot write {self.path}: {exc.strerror}") from None
        if swapped:
            with contextlib.suppress(OSError):
                os.unlink(tmp)  # the last state, swapped out (else ``clean`` takes it)
        if self.written is not None:
            with contextlib.suppress(OSError):
                self.written.put(self.path, _identity(os.stat(self.path)), data)  # (a rename changes its ctime)

    def remove(self) -> None:
        if self.written is not None:
            self.written.drop(self.path)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self._data = {"version": STATE_VERSION}


_SWAP: list[Callable[[Path, Path], bool]] = []


def _swap(new: Path, path: Path) -> bool:
    """Exchange ``new`` and ``path`` atomically (both stay, swapped); ``False`` where this system
    cannot (not Linux, an old kernel or C library, a file system without it, no ``path`` yet): the
    caller replaces instead. ``OSError`` when it failed otherwise."""
    if not _SWAP:
        _SWAP.append(_exchange_function())
    return _SWAP[0](new, path)


def _exchange_function() -> Callable[[Path, Path], bool]:
    def unable(new: Path, path: Path) -> bool:
        return False

    try:
        import ctypes
        import errno
        import sys

        if not sys.platform.startswith("linux"):
            return unable
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (ImportError, OSError, AttributeError):
        return unable
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    renameat2.restype = ctypes.c_int
    at_fdcwd, rename_exchange = -100, 2
    cannot = {errno.ENOENT, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EXDEV}

    def exchange(new: Path, path: Path) -> bool:
        if renameat2(at_fdcwd, os.fsencode(new), at_fdcwd, os.fsencode(path), rename_exchange) == 0:
            return True
        err = ctypes.get_errno()
        if err in cannot:
            return False
        raise OSError(err, os.strerror(err), str(path))

    return exchange
