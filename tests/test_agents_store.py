"""The hooks' session store (``turnguard.agents.store``): one JSON file per session, read and written
under an exclusive lock, replaced whole, never outside its directory whatever the session id, old
sessions cleaned away, oversize states refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from agent_events import AGENTS, Events, hook_env, is_allow, tool_calls
from turnguard.agents import export, hook, stale
from turnguard.agents import store as st
from turnguard.agents.store import MAX_AGE_S, MAX_STATE_BYTES, STATE_VERSION, SessionStore, StoreError, state_root

HOSTILE_IDS = [
    "../../etc",
    "../../../../../../tmp/evil",
    "/etc/passwd",
    ".",
    "..",
    "a/b",
    "x" * 10_000,
    "nul\x00byte",
    "\x00",
    "lone \ud800 surrogate",
    "\udcff\udc80",
    "émoji 👍 ünïcödé",
    "new\nline",
    "C:\\Windows\\system32",
    " ",
]


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    return SessionStore(tmp_path / "state", "claude-code")


def save(store: SessionStore, session_id: str, **data: Any) -> None:
    with store.locked(session_id) as session:
        session.data.update(data)
        session.save()


def load(store: SessionStore, session_id: str) -> dict[str, Any]:
    with store.locked(session_id) as session:
        return dict(session.data)


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file()}


# -- locking -----------------------------------------------------------------------------------------


def test_a_held_session_lock_keeps_every_other_holder_out(store: SessionStore) -> None:
    inside = threading.Event()
    leave = threading.Event()
    errors: list[BaseException] = []

    def holder() -> None:
        try:
            with store.locked("s1"):
                inside.set()
                leave.wait(30)
        except BaseException as exc:  # (reported below)
            errors.append(exc)

    thread = threading.Thread(target=holder)
    thread.start()
    assert inside.wait(30)
    try:
        with pytest.raises(StoreError, match="lock was held"), store.locked("s1", timeout_s=0.05):
            pass
        with store.locked("s2", timeout_s=0.05):  # another session: its own lock
            pass
    finally:
        leave.set()
        thread.join(30)
    assert errors == []
    with store.locked("s1", timeout_s=5):
        pass


def test_read_modify_write_from_two_threads_loses_no_update(store: SessionStore) -> None:
    save(store, "counter", n=0)

    def bump(times: int) -> None:
        for _ in range(times):
            with store.locked("counter") as session:
                session.data["n"] += 1
                session.save()

    threads = [threading.Thread(target=bump, args=(150,)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert load(store, "counter")["n"] == 300


HOLDER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
sys.stdin.read()
"""


def test_a_lock_held_by_another_process_is_waited_for_and_freed_when_it_is_killed(store: SessionStore) -> None:
    save(store, "s1", n=1)
    lock = store.directory / f"{st.session_file_name('s1')}.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"locked\n"
        with pytest.raises(StoreError), store.locked("s1", timeout_s=0.05):
            pass
        holder.kill()  # the kernel releases a dead holder's lock
        holder.wait(30)
        assert load(store, "s1")["n"] == 1
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(30)
        for stream in (holder.stdin, holder.stdout):
            if stream is not None:
                stream.close()


def test_a_hook_facing_a_held_lock_fails_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SessionStore.locked, "__defaults__", (0.05,))  # (20 s as installed)
    env = hook_env(tmp_path)
    events = Events("codex", tmp_path)
    payload = json.dumps(events.pre({"command": "ls"}, events.call_id())).encode()
    store = SessionStore(state_root(env), "codex")
    with store.locked(events.session_id):
        answer = hook.run("codex", payload, env)
    assert answer.output == {} and answer.exit_code == 0
    assert answer.stderr.startswith("turnguard hook codex: session state:") and "lock" in answer.stderr
    assert is_allow(hook.run("codex", payload, env))


# -- writing whole ---------------------------------------------------------------------------------------


def test_a_failing_replace_leaves_the_last_state_and_no_temporary_file(store: SessionStore,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    save(store, "s1", n=1)
    before = store.path("s1").read_bytes()

    def failing_replace(src: Any, dst: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(StoreError, match="cannot write"):
        save(store, "s1", n=2)
    monkeypatch.undo()
    assert store.path("s1").read_bytes() == before
    assert [p.name for p in store.directory.iterdir() if p.name.endswith(".tmp")] == []
    assert load(store, "s1")["n"] == 1


def test_a_failing_write_leaves_the_last_state(store: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    save(store, "s1", n=1)
    before = store.path("s1").read_bytes()
    real_open = open

    class HalfWritten:
        def __init__(self, f: Any) -> None:
            self.f = f

        def __enter__(self) -> HalfWritten:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.f.close()

        def write(self, body: bytes) -> int:
            self.f.write(body[: len(body) // 2])
            raise OSError(27, "File too large")

    def opener(path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(path, mode, *args, **kwargs)
        return HalfWritten(f) if str(path).endswith(".tmp") and "w" in mode else f

    monkeypatch.setattr("builtins.open", opener)
    with pytest.raises(StoreError):
        save(store, "s1", n=2, padding="x" * 10_000)
    monkeypatch.undo()
    assert store.path("s1").read_bytes() == before
    assert [p.name for p in store.directory.iterdir() if p.name.endswith(".tmp")] == []


@pytest.fixture
def served(tmp_path: Path) -> SessionStore:
    """The same directory's store as the long-lived server has it (``Written``: swaps, remembers)."""
    return SessionStore(tmp_path / "state", "claude-code", st.Written())


def temporary_files(store: SessionStore) -> list[str]:
    return [p.name for p in store.directory.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_swap_exchanges_two_files_in_one_step(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("new")
    b.write_text("old")
    if not st._swap(a, b):
        pytest.skip("this file system cannot exchange files")
    assert (a.read_text(), b.read_text()) == ("old", "new")
    assert st._swap(tmp_path / "c", b) is False  # nothing to exchange with: the caller replaces


def test_the_servers_store_writes_whole_states_and_leaves_no_temporary_file(store: SessionStore,
                                                                           served: SessionStore) -> None:
    for n in range(1, 4):
        save(served, "s1", n=n)
        assert json.loads(store.path("s1").read_bytes())["n"] == n
        assert load(store, "s1")["n"] == n
    assert temporary_files(store) == []


@pytest.mark.parametrize("swap", ["fails", "cannot"])
def test_a_failing_or_impossible_swap_still_leaves_a_whole_state(served: SessionStore, swap: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    save(served, "s1", n=1)
    before = served.path("s1").read_bytes()

    def failing(new: Any, path: Any) -> bool:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(st, "_SWAP", [failing if swap == "fails" else (lambda new, path: False)])
    if swap == "fails":
        with pytest.raises(StoreError, match="cannot write"):
            save(served, "s1", n=2)
        assert served.path("s1").read_bytes() == before
        assert load(served, "s1")["n"] == 1
    else:
        save(served, "s1", n=2)
        assert load(SessionStore(served.directory.parent.parent, "claude-code"), "s1")["n"] == 2
    assert temporary_files(served) == []


def test_the_servers_store_reads_a_state_again_once_another_process_wrote_it(
        store: SessionStore, served: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    save(served, "s1", n=1)
    monkeypatch.setattr(st.Session, "_read", lambda self: pytest.fail("read the file it wrote itself"))
    assert load(served, "s1")["n"] == 1
    monkeypatch.undo()
    save(served, "s1", n=2)
    save(store, "s1", n=3)  # a hook process of its own (the client's fallback)
    assert load(served, "s1")["n"] == 3
    store.path("s1").write_text(json.dumps({"version": STATE_VERSION, "n": 44}))  # in place, another size
    assert load(served, "s1")["n"] == 44


def test_the_servers_store_forgets_a_removed_or_cleaned_session(served: SessionStore) -> None:
    save(served, "s1", n=1)
    with served.locked("s1") as session:
        session.remove()
    assert load(served, "s1") == {"version": STATE_VERSION}
    save(served, "s2", n=1)
    served.path("s2").unlink()  # ``clean``
    assert load(served, "s2") == {"version": STATE_VERSION}


def test_a_state_changed_but_not_saved_is_not_remembered(served: SessionStore) -> None:
    save(served, "s1", n=1)
    with pytest.raises(RuntimeError), served.locked("s1") as session:
        session.data["n"] = 2
        raise RuntimeError("the event failed before its state was saved")
    assert load(served, "s1")["n"] == 1


def test_a_state_is_read_back_as_written(store: SessionStore) -> None:
    data = {"turn": None, "journal": [["o", 1, "t", False]], "text": "ünïcödé \ud800 👍", "n": 2**60}
    save(store, "s1", **data)
    assert load(store, "s1") == {"version": STATE_VERSION, **data}
    assert load(store, "never seen") == {"version": STATE_VERSION}


def test_a_removed_session_starts_afresh(store: SessionStore) -> None:
    save(store, "s1", n=1)
    with store.locked("s1") as session:
        session.remove()
        assert session.data == {"version": STATE_VERSION}
    assert not store.path("s1").exists()
    with store.locked("s1") as session:
        session.remove()  # (already gone)
    assert load(store, "s1") == {"version": STATE_VERSION}


@pytest.mark.parametrize("body", [b"", b"\x00\xff", b"[]", b'"text"', b"{}", b'{"version": 2}', b'{"version": "1"}',
                                  b'{"version": 1'])
def test_a_state_that_is_not_a_session_state_is_refused(store: SessionStore, body: bytes) -> None:
    store.directory.mkdir(parents=True)
    store.path("s1").write_bytes(body)
    with pytest.raises(StoreError), store.locked("s1") as session:
        _ = session.data


# -- size ------------------------------------------------------------------------------------------------


def test_an_oversize_state_file_is_refused(store: SessionStore) -> None:
    store.directory.mkdir(parents=True)
    body = b'{"version":1,"pad":"' + b"x" * MAX_STATE_BYTES + b'"}'
    store.path("s1").write_bytes(body)
    with pytest.raises(StoreError, match="larger than"), store.locked("s1") as session:
        _ = session.data


def test_an_oversize_state_is_not_written(store: SessionStore) -> None:
    save(store, "s1", n=1)
    before = store.path("s1").read_bytes()
    with pytest.raises(StoreError, match="larger than"):
        save(store, "s1", pad="x" * MAX_STATE_BYTES)
    assert store.path("s1").read_bytes() == before
    assert [p.name for p in store.directory.iterdir() if p.name.endswith(".tmp")] == []


def test_a_state_just_under_the_bound_is_kept(store: SessionStore) -> None:
    save(store, "s1", pad="")
    overhead = store.path("s1").stat().st_size
    save(store, "s1", pad="x" * (MAX_STATE_BYTES - overhead))
    assert store.path("s1").stat().st_size == MAX_STATE_BYTES
    assert len(load(store, "s1")["pad"]) == MAX_STATE_BYTES - overhead


def test_a_hook_with_an_oversize_state_fails_open(tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    events = Events("gemini", tmp_path)
    store = SessionStore(state_root(env), "gemini")
    store.directory.mkdir(parents=True)
    store.path(events.session_id).write_bytes(b'{"version":1,"pad":"' + b"x" * MAX_STATE_BYTES + b'"}')
    answer = hook.run("gemini", json.dumps(events.pre({"command": "ls"}, None)).encode(), env)
    assert answer.output == {} and answer.exit_code == 0
    assert answer.stderr.startswith("turnguard hook gemini: session state:")


# -- hostile session ids -----------------------------------------------------------------------------------


@pytest.mark.parametrize("session_id", HOSTILE_IDS, ids=lambda s: repr(s)[:40])
def test_any_session_id_names_a_file_inside_the_agents_directory(store: SessionStore, session_id: str) -> None:
    path = store.path(session_id)
    assert path.parent == store.directory
    assert len(path.name) <= 64 and path.name.isascii() and "/" not in path.name and "\x00" not in path.name
    save(store, session_id, n=7)
    assert load(store, session_id)["n"] == 7
    assert {p.parent for p in files_under(store.directory.parents[1])} == {store.directory}


def test_distinct_session_ids_never_share_a_file(store: SessionStore) -> None:
    ids = [*HOSTILE_IDS, "../../etc/", "../../etc\x00", "x" * 10_001, "lone \udc00 surrogate", "s", "S"]
    names = {store.path(i).name for i in ids}
    assert len(names) == len(set(ids))
    for n, session_id in enumerate(ids):
        save(store, session_id, n=n)
    assert [load(store, i)["n"] for i in ids] == list(range(len(ids)))


@pytest.mark.parametrize("agent", AGENTS)
def test_a_hook_keeps_hostile_session_ids_inside_its_directory(agent: str, tmp_path: Path) -> None:
    env = hook_env(tmp_path)
    root = state_root(env)
    for session_id in HOSTILE_IDS:
        events = Events(agent, tmp_path / "project-root", session_id=session_id)
        for _ in range(2):  # the second event reads back what the first wrote
            answer = hook.run(agent, json.dumps(events.pre({"command": "ls"}, events.call_id())).encode(), env)
            assert is_allow(answer), (session_id, answer)
        assert tool_calls(env, agent, session_id) == 2
    agent_dir = root / "hooks" / agent
    shared = {root / "hooks" / "entrypoints.json", root / "hooks" / stale.MARKER}  # (the plugin scan, the sweep)
    assert {p.parent for p in files_under(tmp_path) if p.is_relative_to(root) and p not in shared} == {agent_dir}
    assert [p for p in files_under(tmp_path) if not p.is_relative_to(tmp_path / "project-root")
            and not p.is_relative_to(root)] == []
    assert len(list(agent_dir.glob("*.json"))) == len(HOSTILE_IDS)


# -- cleaning ---------------------------------------------------------------------------------------------------


def age(path: Path, seconds: float, now: float) -> None:
    os.utime(path, (now - seconds, now - seconds))


def test_clean_removes_old_sessions_and_stale_temporary_files_only(store: SessionStore) -> None:
    now = time.time()
    for session_id in ("old", "fresh", "week-minus-a-minute"):
        save(store, session_id, n=1)
    lock = store.directory / f"{st.session_file_name('old')}.lock"
    age(store.path("old"), MAX_AGE_S + 3600, now)
    age(lock, MAX_AGE_S + 3600, now)
    age(store.path("week-minus-a-minute"), MAX_AGE_S - 60, now)
    stale_tmp = store.directory / f".{store.path('fresh').name}.4242.tmp"
    fresh_tmp = store.directory / f".{store.path('fresh').name}.4243.tmp"
    for tmp in (stale_tmp, fresh_tmp):
        tmp.write_text("{")
    age(stale_tmp, 600, now)
    age(fresh_tmp, 5, now)
    (store.directory / "a-folder").mkdir()
    age(store.directory / "a-folder", MAX_AGE_S * 2, now)

    assert store.clean(now=now) == 3
    assert not store.path("old").exists() and not lock.exists() and not stale_tmp.exists()
    assert store.path("fresh").exists() and store.path("week-minus-a-minute").exists() and fresh_tmp.exists()
    assert (store.directory / "a-folder").is_dir()
    assert load(store, "fresh")["n"] == 1


def test_clean_never_removes_the_lock_of_a_session_in_use(store: SessionStore) -> None:
    """A session in use for longer than ``MAX_AGE_S`` (resumed day after day): its state file is
    new, its lock file as old as the session. While one hook holds that lock, a clean (another
    session's new turn) must not let a second hook of the session in."""
    save(store, "long-lived", n=1)
    now = time.time()
    lock = store.directory / f"{st.session_file_name('long-lived')}.lock"
    with store.locked("long-lived") as session:
        age(lock, MAX_AGE_S + 3600, now)
        store.clean(now=now)
        with pytest.raises(StoreError, match="lock was held"), store.locked("long-lived", timeout_s=0.05):
            pass
        session.data["n"] = 2
        session.save()
    assert load(store, "long-lived")["n"] == 2


def test_clean_of_a_missing_directory_removes_nothing(tmp_path: Path) -> None:
    assert SessionStore(tmp_path / "nothing", "codex").clean() == 0


def test_a_new_turn_cleans_old_sessions_of_its_agent_once_their_turn_is_handed_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export, "start_exporter", lambda environ: None)
    env = hook_env(tmp_path)
    old, current = Events("codex", tmp_path / "old"), Events("codex", tmp_path / "current")
    assert is_allow(hook.run("codex", json.dumps(old.pre({"command": "ls"}, old.call_id())).encode(), env))
    store = SessionStore(state_root(env), "codex")
    age(store.path(old.session_id), MAX_AGE_S + 60, time.time())
    (state_root(env) / "hooks" / stale.MARKER).unlink()  # (no sweep for a minute since the first event)
    assert is_allow(hook.run("codex", json.dumps(current.prompt()).encode(), env))
    assert store.path(old.session_id).exists(), "its open turn was not exported yet"
    assert len(list(export.outbox_dir(state_root(env)).glob("*.json"))) == 1, "the sweep handed it over"
    age(store.path(old.session_id), MAX_AGE_S + 60, time.time())
    assert is_allow(hook.run("codex", json.dumps(current.prompt()).encode(), env))
    assert not store.path(old.session_id).exists()
    assert store.path(current.session_id).exists()


# -- where ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "expected"), [
    ({"TURNGUARD_STATE_DIR": "/srv/tg", "XDG_STATE_HOME": "/x", "HOME": "/h"}, "/srv/tg"),
    ({"XDG_STATE_HOME": "/x", "HOME": "/h"}, "/x/turnguard"),
    ({"XDG_STATE_HOME": "relative/x", "HOME": "/h"}, "/h/.local/state/turnguard"),
    ({"TURNGUARD_STATE_DIR": "", "HOME": "/h"}, "/h/.local/state/turnguard"),
])
def test_the_state_directory(environ: dict[str, str], expected: str) -> None:
    assert state_root(environ) == Path(expected)


def test_the_sessions_of_each_agent_are_apart(tmp_path: Path) -> None:
    stores = [SessionStore(tmp_path, agent) for agent in AGENTS]
    for n, s in enumerate(stores):
        save(s, "same-id", n=n)
    assert [load(s, "same-id")["n"] for s in stores] == [0, 1, 2]
    assert len({s.path("same-id") for s in stores}) == 3


def test_the_servers_memory_of_states_is_bounded_in_sessions_and_bytes(tmp_path: Path) -> None:
    written = st.Written(limit=3, max_bytes=3000)
    served = SessionStore(tmp_path / "state", "claude-code", written)
    for i in range(5):
        save(served, f"s{i}", pad="x" * 500)
    assert [p.name for p in written._states] == [served.path(f"s{i}").name for i in (2, 3, 4)]
    save(served, "big", pad="x" * 2500)  # with the newest one, over the bytes: only it stays
    assert [p.name for p in written._states] == [served.path("big").name]
    save(served, "huge", pad="x" * 4000)  # larger than the bound alone: not kept
    assert [p.name for p in written._states] == [served.path("big").name]
    assert load(served, "huge")["pad"] == "x" * 4000


def test_a_swapped_state_is_saved_even_when_the_old_one_cannot_be_removed(
        served: SessionStore, monkeypatch: pytest.MonkeyPatch) -> None:
    save(served, "s1", n=1)

    def exchange(new: Path, path: Path) -> bool:  # (in three steps: any system)
        os.rename(path, f"{new}.x")
        os.rename(new, path)
        os.rename(f"{new}.x", new)
        return True

    monkeypatch.setattr(st, "_SWAP", [exchange])

    def cannot(path: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(os, "unlink", cannot)
    save(served, "s1", n=2)  # no StoreError: the new state is in place
    monkeypatch.undo()
    assert load(SessionStore(served.directory.parent.parent, "claude-code"), "s1")["n"] == 2
    assert len(temporary_files(served)) == 1  # the old state, for ``clean``
