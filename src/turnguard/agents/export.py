"""Telemetry and the recorder's line for hook turns, made after the turn by a detached process.

A hook answers within a tool call's latency, so it neither imports the OpenTelemetry SDK nor
waits for an export. Instead each event adds a line to the turn's journal (what was checked,
keyed; what came back; the answers; when), and the hook that ends the turn hands the journal
over: it writes it whole into the outbox (``hooks/outbox/``) and starts ``python -m
turnguard.agents.export`` detached. That process replays each journal through a guard with the
full configuration and its observers (the OpenTelemetry plugin, configured from the standard
``OTEL_*`` variables, and the recorder), on the journal's clock, so spans, ``LoopDetectedEvent``
records, metrics and the recorder's line are those a Python host running the same turn would
have made, with ``gen_ai.agent.name`` the agent's name. It then flushes, and removes the journal
once every signal's export succeeded.

Nothing is lost when a process dies or the collector is down: a journal leaves the outbox only
after its export succeeded. One an exporter failed to export (at its first failure it stops) or
left when it died is taken by the next, at the next turn's end (at least once: a turn's telemetry
can be reported twice when an export succeeded in part, or an exporter died between its flush and
the removal; the recorder's line is written once, at the first replay, which marks the journal).
The outbox keeps at most ``OUTBOX_LIMIT`` journals, dropping the oldest. The journal holds key
digests, never arguments or results.

The recorder writes hook turns to ``recorder_path`` when set, else to ``turns.jsonl`` in the state
directory (``store.state_root``), the input of ``turnguard calibrate``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from turnguard.agents.store import state_root

OUTBOX = "outbox"


def outbox_dir(root: Path) -> Path:
    return root / "hooks" / OUTBOX


def hand_over(agent: str, data: dict[str, Any], environ: Mapping[str, str]) -> None:
    """Write the ended turn's journal into the outbox and start the exporter (the caller holds
    the session's lock; the exporter runs after the hook has answered)."""
    journal = data.get("journal") or []
    if not journal or journal[0][0] != "o":
        return
    root = state_root(dict(environ))
    box = outbox_dir(root)
    box.mkdir(parents=True, exist_ok=True, mode=0o700)
    turn = data.get("turn")
    item = {"agent": agent, "session": data.get("session", ""), "cwd": data.get("cwd"), "journal": journal,
            "config": turn.get("config") if isinstance(turn, dict) else None}
    name = f"{time.time_ns():020d}-{journal[0][2]}.json"
    tmp = box / f".{name}.tmp"
    tmp.write_text(json.dumps(item, separators=(",", ":")), encoding="utf-8")
    os.replace(tmp, box / name)
    start_exporter(environ)


def start_exporter(environ: Mapping[str, str]) -> None:
    """``python -m turnguard.agents.export`` in a session of its own, its output in the state
    directory's ``hooks/export.log``; the hook does not wait for it."""
    root = state_root(dict(environ))
    log = open(root / "hooks" / "export.log", "ab")  # noqa: SIM115 (handed to the child)
    try:
        subprocess.Popen([sys.executable, "-m", "turnguard.agents.export"], stdin=subprocess.DEVNULL,
                         stdout=log, stderr=log, start_new_session=True, close_fds=True, env=dict(environ))
    finally:
        log.close()


# -- the exporter process ---------------------------------------------------------------------------


class ReplayClock:
    """The journal's time, for the modules that read the clock while a turn runs."""

    def __init__(self) -> None:
        self.now_ns = time.time_ns()

    def time_ns(self) -> int:
        return self.now_ns

    def monotonic(self) -> float:
        return self.now_ns / 1e9

    @contextlib.contextmanager
    def installed(self) -> Iterator[ReplayClock]:
        """Turns, shadows and spans read this clock inside the block (this process does nothing else)."""
        from turnguard import _ledger as ledger
        from turnguard import _shadow as shadow
        from turnguard.telemetry import _spans as spans

        clock = SimpleNamespace(time_ns=self.time_ns, monotonic=self.monotonic)
        saved = (ledger.time, shadow.time, spans.time_ns)
        ledger.time, shadow.time, spans.time_ns = clock, clock, self.time_ns  # type: ignore[assignment]
        try:
            yield self
        finally:
            ledger.time, shadow.time, spans.time_ns = saved


def replay(guard: Any, item: dict[str, Any], clock: ReplayClock) -> Any:
    """Run the journal's turn through ``guard``: the same calls in the same order, so the same
    verdicts; returns the ended turn (``None`` for a journal cut at ``hook.MAX_JOURNAL``)."""
    from turnguard._model import ToolCall

    journal = item["journal"]
    if ["x"] in journal:
        return None
    _, opened, turn_id, attended = journal[0]
    clock.now_ns = opened
    turn = guard.turn(conversation_id=item.get("session") or None, agent_name=item["agent"],
                      promptable=bool(attended), turn_id=turn_id)
    checked: dict[Any, list[Any]] = {}
    verdicts: dict[int, Any] = {}
    for at, entry in enumerate(journal):
        kind = entry[0]
        if at == 0:
            continue
        clock.now_ns = entry[1]
        if kind == "m":
            turn.begin_cycle()
        elif kind == "c":
            _, _, name, digest, call_id = entry
            call = ToolCall(name, digest, call_id=call_id)
            checked.setdefault(call_id or (name, digest), []).append(call)
            verdicts[at] = turn.check_call(call)
        elif kind == "r":
            _, _, name, digest, call_id, outcome, result = entry
            waiting = checked.get(call_id or (name, digest))
            call = waiting.pop(0) if waiting else ToolCall(name, digest, call_id=call_id)
            verdicts[at] = turn.record_outcome(call, outcome, result)
        elif kind == "a":
            asked = verdicts.get(entry[3])
            if asked is not None and asked.event is not None:
                turn.resolve(asked.event, entry[2])
        elif kind == "e":
            break
    turn.end(entry[2] if journal[-1][0] == "e" else "completed")
    return turn


OUTBOX_LIMIT = 256
"""The most journals the outbox keeps for a later export (a collector down for long): an
exporter drops the oldest beyond, saying so in ``hooks/export.log``."""
RECORDED = "recorded"
"""A journal's mark once its replay wrote the recorder's line and the result token: a journal left
for a later export is replayed again for its telemetry only, so the recorder holds each turn once."""
REPLAY_QUEUE = 65_536
"""The exporter's span and log queues (where ``OTEL_BSP_MAX_QUEUE_SIZE`` and
``OTEL_BLRP_MAX_QUEUE_SIZE`` are unset): more than a journal's entries (``hook.MAX_JOURNAL``), so
no span of a turn is dropped before the flush that follows its replay."""
FLUSH_TIMEOUT_MS = 15_000


def export_outbox(environ: Mapping[str, str]) -> int:
    """Replay and export the outbox's journals, oldest first; returns how many were exported.

    Each leaves the outbox only after the flush that follows its replay succeeded for every
    signal. At the first export that fails (the collector down, silent or refusing), the journal
    stays, marked ``RECORDED``, and so do the journals after it: the next turn's exporter takes
    them."""
    root = state_root(dict(environ))
    box = outbox_dir(root)
    telemetry = telemetry_from_env(environ)
    guards: dict[tuple[str, bool, str], Any] = {}
    done = 0
    clock = ReplayClock()
    try:
        with clock.installed():
            journals = sorted(box.glob("*.json"))
            _drop_oldest(journals[:-OUTBOX_LIMIT])
            for path in journals[-OUTBOX_LIMIT:]:
                with _claimed(path) as claim:
                    if claim is None:
                        continue
                    item = claim.item
                    recorded = bool(item.get(RECORDED))
                    try:
                        turn = replay(_guard_for(guards, item, root, environ, recorded=recorded), item, clock)
                    except Exception as exc:  # a journal this exporter cannot replay is kept aside, not retried
                        print(f"turnguard export: {path.name}: {type(exc).__name__}: {exc}; kept as .failed",
                              file=sys.stderr)
                        claim.set_aside()
                        continue
                    if not recorded:
                        if turn is not None:
                            keep_token(root, item, turn.result_token)
                        claim.mark_recorded()
                    if not _flushed(telemetry):
                        print(f"turnguard export: {path.name}: the export failed; it and the later journals "
                              f"stay for the next exporter", file=sys.stderr)
                        return done
                    claim.remove()
                    done += 1
            if (root / "hooks" / "errors.log").exists():
                guard = next(iter(guards.values()), None) or _guard_for(guards, {}, root, environ)
                _report_failures(root, guard, lambda: _flushed(telemetry))
    finally:
        if telemetry is not None:
            telemetry.shutdown()
    return done


def _flushed(telemetry: Any) -> bool:
    """Whether everything recorded so far was exported (no exporter failed, none timed out)."""
    if telemetry is None:
        return True
    try:
        flushed = telemetry.force_flush(FLUSH_TIMEOUT_MS)
    except Exception:  # (the meter provider raises when a reader failed or timed out)
        flushed = False
    return bool(flushed) and telemetry.exports.failed == 0


def _drop_oldest(journals: list[Path]) -> None:
    """Remove ``journals``, the oldest beyond ``OUTBOX_LIMIT`` (those another exporter holds stay)."""
    dropped = 0
    for path in journals:
        with _claimed(path) as claim:
            if claim is not None:
                claim.remove()
                dropped += 1
    if dropped:
        print(f"turnguard export: the outbox holds at most {OUTBOX_LIMIT} journals; dropped the {dropped} "
              f"oldest unexported", file=sys.stderr)


RESULTS = "results"
"""Under ``hooks/``: each session's last ended turn's result token, for ``turnguard result``."""


def results_config(config: Any, root: Path) -> Any:
    """``config`` with the hooks' own ``digest_key`` (``hooks/results.key``, made once, readable by
    this user only) where it sets none: the exporter's result tokens are then checked with a key
    by ``turnguard result``, so their labels (the agent, the threshold) are shown as they are."""
    if config.digest_key is not None:
        return config
    path = root / "hooks" / "results.key"
    try:
        key = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        key = ""
    if len(key) != 64:
        key = secrets.token_hex(32)
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(key)
        with contextlib.suppress(OSError, UnicodeDecodeError):
            key = path.read_text(encoding="ascii").strip() or key  # another process made it first
    return config.replace(digest_key=key)


def keep_token(root: Path, item: dict[str, Any], token: str | None) -> None:
    """The turn's result token in ``hooks/results/AGENT/SESSION.json`` (the session's last turn),
    so ``turnguard result AGENT resolved|unresolved`` can report how its task went."""
    if token is None:
        return
    from turnguard.agents.store import session_file_name

    folder = root / "hooks" / RESULTS / str(item["agent"])
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = folder / f"{session_file_name(str(item.get('session') or ''))}.json"
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"token": token, "session": item.get("session")}), encoding="utf-8")
        os.replace(tmp, path)


def _guard_for(guards: dict[tuple[str, bool, str], Any], item: dict[str, Any], root: Path, environ: Mapping[str, str],
               *, recorded: bool = False) -> Any:
    """The full guard of the project the turn ran in (its ``turnguard.toml``), deciding under the
    settings the turn was decided under (``_snapshot.decided_config``: the file may have changed
    since), one per project and settings; without the recorder for a journal already ``recorded``."""
    from turnguard._config import GuardConfig
    from turnguard._guard import Guard
    from turnguard._snapshot import SnapshotError, decided_config

    search = _search(item.get("cwd"))
    settings = item.get("config")
    key = (search, recorded, json.dumps(settings, sort_keys=True))
    guard = guards.get(key)
    if guard is None:
        config = results_config(GuardConfig.load(environ=environ, search=search), root)
        if settings is not None:
            with contextlib.suppress(SnapshotError):
                config = decided_config(config, settings)
        if recorded:
            config = config.replace(recorder_path=None)
        elif config.recorder_path is None:
            config = config.replace(recorder_path=str(root / "turns.jsonl"))
        guard = guards[key] = Guard(config, environ=environ)
    return guard


def _report_failures(root: Path, guard: Any, flushed: Callable[[], bool]) -> None:
    """The hooks' failures since the last export (``hooks/errors.log``, one line each) counted in
    ``turnguard.host.errors`` (``turnguard.host_error="hook_failed"``, by agent); given back to the
    log when their export fails (``flushed``)."""
    otel = guard.pm.get_plugin("otel")
    if otel is None:
        return
    from turnguard.telemetry._names import HOOK_FAILED

    log = root / "hooks" / "errors.log"
    taken = log.with_name(f"errors.log.{os.getpid()}")
    try:
        os.replace(log, taken)  # the hooks append to a new log from now on
        text = taken.read_bytes()
    except OSError:
        return
    for line in text.decode("utf-8", errors="replace").splitlines():
        fields = line.split("\t")
        if otel is not None and len(fields) >= 2:
            otel.instruments.outcome_ignored("-", fields[1], HOOK_FAILED, otel.scope)
    with contextlib.suppress(OSError):
        if otel is not None and not flushed():
            with open(log, "ab") as f:
                f.write(text)
        os.unlink(taken)


class _Claim:
    """A journal this exporter holds: its path, its content, and the descriptor whose lock holds it."""

    def __init__(self, path: Path, item: dict[str, Any], fd: int) -> None:
        self.path, self.item, self.fd = path, item, fd

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def set_aside(self) -> None:
        with contextlib.suppress(OSError):
            os.replace(self.path, self.path.with_suffix(".failed"))

    def mark_recorded(self) -> None:
        """The journal rewritten whole with its ``RECORDED`` mark, locked before it replaces the
        old one, so no other exporter takes it meanwhile. Best effort: unmarked, the next replay
        only writes the recorder's line again."""
        item = {**self.item, RECORDED: True}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, json.dumps(item, separators=(",", ":")).encode("utf-8"))
            os.replace(tmp, self.path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            os.close(fd)
            return
        os.close(self.fd)
        self.fd, self.item = fd, item


@contextlib.contextmanager
def _claimed(path: Path) -> Iterator[_Claim | None]:
    """The journal at ``path``, locked for this exporter until the block ends; ``None`` when
    another exporter has it, it is gone or replaced, or it is not a journal's JSON object."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        yield None
        return
    claim: _Claim | None = None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield None
            return
        try:
            with os.fdopen(os.dup(fd), "rb") as f:
                item = json.loads(f.read())
            held, now = os.fstat(fd), os.stat(path)
        except (OSError, ValueError, RecursionError):  # (nested deeper than this process can parse)
            item = None
        if not isinstance(item, dict) or (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
            yield None
            return
        claim = _Claim(path, item, fd)
        yield claim
    finally:
        os.close(claim.fd if claim is not None else fd)


def _search(cwd: Any) -> str:
    return cwd if isinstance(cwd, str) and os.path.isdir(cwd) else "."


def otel_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` with each ``TURNGUARD_OTEL_X`` as ``OTEL_X`` where that is not set: Claude Code
    gives its hooks no ``OTEL_*`` variable, so they reach turnguard's exporter under its prefix."""
    from turnguard._config import OTEL_PASSTHROUGH

    env = dict(environ)
    for name, value in environ.items():
        if name.startswith(OTEL_PASSTHROUGH):
            env.setdefault(name[len("TURNGUARD_"):], value)
    return env


def telemetry_from_env(environ: Mapping[str, str]) -> Any:
    """OTLP export when an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variable is set (else none)."""
    env = otel_environ(environ)
    if not any(k.startswith("OTEL_EXPORTER_OTLP_") and k.endswith("ENDPOINT") for k in env):
        return None
    for queue in ("OTEL_BSP_MAX_QUEUE_SIZE", "OTEL_BLRP_MAX_QUEUE_SIZE"):
        env.setdefault(queue, str(REPLAY_QUEUE))
    from turnguard.telemetry import configure

    return configure(service_name=env.get("OTEL_SERVICE_NAME") or "turnguard-hooks", set_global=True,
                     environ=env, shutdown_timeout_ms=None if "TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT" in env
                     else 15_000)


def main() -> int:
    try:
        count = export_outbox(os.environ)
    except Exception as exc:  # the log says why; the journals stay for the next exporter
        print(f"turnguard export: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"turnguard export: {count} turn(s) exported", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
