"""Shadow policies: configuration, side-by-side evaluation on live traffic, reporting, isolation."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field

import pytest

import turnguard as tg
from conftest import CORE_ONLY, distinct_call, drive
from turnguard import _shadow as shadow_module
from turnguard._dispatch import Impl
from turnguard._ledger import Ledger
from turnguard._plugins import NON_POLICY_PLUGINS

LIVE_ONLY = {"disable_plugins": tuple(p for p in NON_POLICY_PLUGINS if p != "shadow"), "load_entrypoints": False}
"""The core policies and the shadow plugin (no telemetry)."""


@dataclass
class Heard:
    """What the reporting hooks said: would-be detections and per-shadow summaries."""

    live: list[tg.LoopDetectedEvent] = field(default_factory=list)
    detected: list[tuple[str, tg.LoopDetectedEvent]] = field(default_factory=list)
    ended: dict[str, tg.TurnSummary] = field(default_factory=dict)

    @tg.hookimpl
    def turnguard_loop_detected(self, event):
        self.live.append(event)

    @tg.hookimpl
    def turnguard_shadow_detected(self, turn, policy, event):
        assert isinstance(turn.turn_id, str)
        self.detected.append((policy, event))

    @tg.hookimpl
    def turnguard_shadow_turn_ended(self, policy, summary):
        self.ended[policy] = summary

    def of(self, policy: str) -> list[tg.LoopDetectedEvent]:
        return [e for p, e in self.detected if p == policy]


def shadow_guard(shadow, **options) -> tuple[tg.Guard, Heard]:
    heard = Heard()
    config = tg.GuardConfig(**{**LIVE_ONLY, **options}, shadow=shadow)
    return tg.Guard(config, plugins={"heard": heard}, environ={}), heard


def edit_and_rerun(cycles: int) -> list[tg.ToolCall]:
    test = tg.ToolCall("bash", "mvn -q test")
    calls = []
    for i in range(cycles):
        calls += [tg.ToolCall("edit", {"path": "src/A.java", "line": i}), test]
    return calls


def events_view(events):
    return [(e.threshold, e.action, e.level, e.limit, e.tool_calls, e.streak_length, e.failing_streak_length)
            for e in events]


# -- configuration ---------------------------------------------------------------------------------


def test_no_shadows_no_plugin():
    assert shadow_module.plugin_for(tg.GuardConfig()) is None
    guard = tg.Guard(tg.GuardConfig(**LIVE_ONLY), environ={})
    assert guard.pm.get_plugin("shadow") is None


def test_shadows_given_as_mapping_pairs_or_configs_resolve_over_the_live_config():
    live = tg.GuardConfig(soft_cap=50, shadow={"stale": {"stuck_signal": "stale_repeat"},
                                               "own": tg.GuardConfig(soft_cap=7)})
    resolved = dict(live.shadow_configs())
    assert resolved["stale"].soft_cap == 50 and resolved["stale"].stuck_signal == "stale_repeat"
    assert resolved["own"].soft_cap == 7 and resolved["own"].shadow == ()
    pairs = tg.GuardConfig(shadow=[("a", {"soft_cap": 20})])
    assert dict(pairs.shadow_configs())["a"].soft_cap == 20


def test_shadow_tables_load_from_toml(tmp_path):
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.turnguard]\nsoft_cap = 40\n\n'
                    '[tool.turnguard.shadow.stale]\nstuck_signal = "stale_repeat"\n\n'
                    '[tool.turnguard.shadow.any-streak]\nstreak-stop-on = "any"\nsoft_cap = 80\n')
    config = tg.GuardConfig.load(path, environ={"TURNGUARD_STREAK_STOP_AT": "9"})
    shadows = dict(config.shadow_configs())
    assert set(shadows) == {"stale", "any-streak"}
    assert (shadows["stale"].soft_cap, shadows["stale"].stuck_signal) == (40, "stale_repeat")
    assert (shadows["any-streak"].soft_cap, shadows["any-streak"].streak_stop_on) == (80, "any")
    assert shadows["stale"].streak_stop_at == 9  # resolved over the final live configuration


@pytest.mark.parametrize("shadow, key", [
    ("tight", "shadow"),  # a bare string
    ([("tight",)], "shadow"),  # not a pair
    ([("", {})], "shadow"),  # no name
    ([(3, {})], "shadow"),  # a name that is not a string
    ([("a", {}), ("a", {"soft_cap": 3})], "shadow.a"),  # a repeated name
    ({"a": 5}, "shadow.a"),  # neither a config nor a mapping
    ({"a": {"soft_cap": "many"}}, "shadow.a.soft_cap"),  # a bad option value
    ({"a": {"no_such_option": 1}}, "shadow.a.no_such_option"),  # an unknown option
    ({"a": {"shadow": {"b": {}}}}, "shadow.a.shadow"),  # shadows of shadows
    ({"a": tg.GuardConfig(shadow={"b": {}})}, "shadow.a.shadow"),
])
def test_bad_shadows_are_config_errors(shadow, key):
    with pytest.raises(tg.ConfigError) as info:
        tg.GuardConfig(shadow=shadow)
    assert info.value.key == key


def test_shadows_cannot_come_from_the_environment():
    with pytest.raises(tg.ConfigError, match="shadow"):
        tg.GuardConfig.from_env({"TURNGUARD_SHADOW": "stale"})


# -- evaluation --------------------------------------------------------------------------------------


@pytest.mark.parametrize("promptable", [False, True])
def test_a_shadow_configured_like_the_live_guard_reports_exactly_the_live_detections(promptable):
    options = {"soft_cap": 30, "streak_warn_at": 3, "streak_stop_at": 5, "max_cycles_per_turn": 0}
    guard, heard = shadow_guard({"twin": options}, **options)
    stuck = tg.ToolCall("bash", "mvn test")
    calls = [distinct_call(i) for i in range(10)] + [stuck] * 4
    calls += [distinct_call(i) for i in range(10, 40)] + [stuck] * 8
    with guard.turn(promptable=promptable) as turn:
        for call in calls:
            turn.begin_cycle()
            verdict = turn.check_call(call)
            if verdict.action is tg.Action.HALT:
                break
            verdict = turn.record_outcome(call, tg.Outcome.ERROR)
            if verdict.action is tg.Action.ASK:
                turn.resolve(verdict, "continue")
            if verdict.action is tg.Action.HALT:
                break
    assert heard.live and events_view(heard.of("twin")) == events_view(heard.live)
    live, twin = turn.summary, heard.ended["twin"]
    assert (twin.halted, twin.threshold, twin.tool_calls, twin.max_key_repeat, twin.detections) == (
        live.halted, live.threshold, live.tool_calls, live.max_key_repeat, live.detections)


TWIN = {"stateful_tools": ("poll",), "streak_exempt_tools": ("wait",), "streak_warn_at": 3, "streak_stop_at": 5,
        "cycle_repeat_warn_at": 3, "cycle_repeat_stop_at": 4, "soft_cap": 12, "hard_multiplier": 4,
        "stuck_repeat_threshold": 4, "max_cycles_per_turn": 0}
"""Every threshold in play, low enough that random turns reach them, and both polling lists."""
POOL = [("poll", {"j": 1}), ("poll", {"j": 2}), ("wait", {}), ("build", {}), ("read", {"p": 1}), ("read", {"p": 2})]


@pytest.mark.parametrize("seed", range(300))
def test_a_twin_shadow_reports_the_live_detections_on_random_turns(seed):
    """Loops of a few calls (cycles, streaks, polls with results that change or stay), batches
    whose outcomes come in any order, a lost outcome now and then, retries, and every ASK answered
    "continue": a shadow configured like the live guard reports the live detections, in order."""
    rng = random.Random(seed)
    options = {**TWIN, "streak_stop_on": rng.choice(("error", "any"))}
    guard, heard = shadow_guard({"twin": options}, **options)
    loop = rng.sample(POOL, rng.choice((2, 3)))
    with guard.turn(promptable=rng.random() < 0.7) as turn:
        n = 0
        while n < 60 and turn.halted is None:
            turn.begin_cycle()
            batch = []
            for _ in range(rng.choice((1, 1, 2, 3))):
                name, args = loop[n % len(loop)] if rng.random() < 0.7 else rng.choice(POOL)
                n += 1
                call = tg.ToolCall(name, args, call_id=f"c{n}")
                verdict = turn.check_call(call)
                if verdict.action is tg.Action.ASK:
                    turn.resolve(verdict, "continue")
                batch.append(call)
            if rng.random() < 0.05:
                turn.retry()
                continue
            rng.shuffle(batch)
            for call in batch:
                if rng.random() < 0.05:
                    continue  # its outcome never comes
                verdict = turn.record_outcome(call, rng.choice(("ok", "error", "error", "denied")),
                                              result=rng.choice(("a", "a", "b", None)))
                if verdict.action is tg.Action.ASK:
                    turn.resolve(verdict, "continue")
    assert events_view(heard.of("twin")) == events_view(heard.live)


def test_shadows_never_change_the_live_verdicts():
    calls = edit_and_rerun(40)
    plain, _ = shadow_guard((), soft_cap=20)
    tight = {"soft_cap": 5, "streak_stop_on": "any", "streak_warn_at": 2, "streak_stop_at": 2}
    shadowed, heard = shadow_guard({"tight": tight}, soft_cap=20)
    with plain.turn() as t1, shadowed.turn() as t2:
        v1, v2 = drive(t1, calls), drive(t2, calls)
    assert [(v.action, v.threshold) for v in v1] == [(v.action, v.threshold) for v in v2]
    assert heard.of("tight")


def test_stale_shadow_spares_edit_and_rerun_where_the_seed_shadow_would_halt():
    guard, heard = shadow_guard({"seed": {"soft_cap": 20}, "stale": {"soft_cap": 20, "stuck_signal": "stale_repeat"}},
                                soft_cap=500)
    with guard.turn() as turn:
        verdicts = drive(turn, edit_and_rerun(60))
    assert all(v.action is tg.Action.ALLOW for v in verdicts) and len(verdicts) == 120
    [seed_halt] = heard.of("seed")
    assert (seed_halt.threshold, seed_halt.action, seed_halt.tool_calls) == (
        tg.Threshold.SOFT_STUCK, tg.Action.HALT, 21)
    assert heard.of("stale") == []
    seed, stale = heard.ended["seed"], heard.ended["stale"]
    assert (seed.halted, seed.tool_calls, seed.reason) == (True, 21, "halted")
    assert (stale.halted, stale.tool_calls, stale.reason) == (False, 120, "completed")


def test_a_would_be_halt_latches_and_the_shadow_stops_counting():
    guard, heard = shadow_guard({"any": {"streak_stop_on": "any", "streak_warn_at": 0, "streak_stop_at": 3}})
    call = tg.ToolCall("search", {"q": "same"})
    with guard.turn() as turn:
        verdicts = drive(turn, [call] * 10)
    assert all(v.action is tg.Action.ALLOW for v in verdicts)  # OK outcomes: the live seed rule never stops
    would_be = [(e.threshold, e.action, e.tool_calls) for e in heard.of("any")]
    assert would_be == [(tg.Threshold.STREAK, tg.Action.HALT, 3)]
    assert heard.ended["any"].tool_calls == 3 and heard.ended["any"].halted


def test_a_shadow_with_another_key_mode_keys_calls_itself():
    guard, heard = shadow_guard({"bytes": {"key_mode": "bytes", "streak_warn_at": 3}}, streak_warn_at=3)
    spellings = ['{"a": 1, "b": 2}', '{"b":2,"a":1}', '{"a":1,"b":2}']
    with guard.turn() as turn:
        drive(turn, [tg.ToolCall("api", spellings[i % 3]) for i in range(3)])
    assert [e.threshold for e in heard.live] == [tg.Threshold.STREAK]  # canonical: one call three times
    assert heard.of("bytes") == [] and heard.ended["bytes"].distinct_keys == 3


def test_calls_that_reach_the_hooks_unkeyed_are_keyed_as_the_live_guard_keys_them():
    guard, heard = shadow_guard({"twin": {"streak_warn_at": 2}}, digest_key="k")
    ledger = Ledger(guard.config)  # a host driving turnguard's plugins from its own manager: no Turn
    guard.pm.hook.turnguard_turn_started(turn=ledger)
    for text in ['{"a": 1}', '{"a": 2}', '{"a":2}']:  # two calls, then the second again
        call = tg.ToolCall("api", text)  # never keyed
        ledger.count_call(guard.keyer.digest("api", text), "api")
        guard.pm.hook.turnguard_check_call(turn=ledger, call=call)
    assert [(e.tool_calls, e.streak_length) for e in heard.of("twin")] == [(3, 2)]
    assert heard.of("twin")[0].key_digest is None  # nothing cached on the call, nothing invented


@pytest.mark.parametrize("keyed", [False, True], ids=["unkeyed", "keyed outside a turn"])
def test_outcomes_that_reach_the_hooks_from_a_hosts_own_manager_settle_the_latest_check(keyed):
    guard, heard = shadow_guard({"twin": {"streak_warn_at": 0, "streak_stop_at": 3}}, digest_key="k")
    ledger = Ledger(guard.config)  # no Turn: the calls carry no live check number
    guard.pm.hook.turnguard_turn_started(turn=ledger)
    for _ in range(3):
        call = tg.ToolCall("build", {"target": "all"})
        digest = guard.keyer.key_of(call) if keyed else guard.keyer.digest(call.name, call.args)
        ledger.record_outcome(ledger.count_call(digest, "build"), tg.Outcome.ERROR)
        guard.pm.hook.turnguard_check_call(turn=ledger, call=call)
        guard.pm.hook.turnguard_check_outcome(turn=ledger, call=call, outcome=tg.Outcome.ERROR)
    assert [(e.tool_calls, e.failing_streak_length) for e in heard.of("twin")] == [(3, 3)]


def test_retry_rolls_the_shadow_ledgers_back():
    guard, heard = shadow_guard({"twin": {}})
    with guard.turn() as turn:
        turn.begin_cycle()
        drive(turn, [distinct_call(i) for i in range(5)])
        turn.retry()
        turn.begin_cycle()
        drive(turn, [distinct_call(i) for i in range(2)])
    assert heard.ended["twin"].tool_calls == turn.summary.tool_calls == 2
    assert heard.ended["twin"].cycles == 2


def test_the_live_users_continue_resets_the_shadow_streaks():
    guard, heard = shadow_guard({"twin": {"streak_warn_at": 3, "streak_stop_at": 0}}, streak_warn_at=3,
                                streak_stop_at=0)
    call = tg.ToolCall("ls", "ls")
    with guard.turn(promptable=True) as turn:
        for _ in range(6):
            verdict = turn.check_call(call)
            if verdict.action is tg.Action.ASK:
                turn.resolve(verdict, "continue")
            turn.record_outcome(call, tg.Outcome.OK)
    assert [e.tool_calls for e in heard.live] == [3, 6] == [e.tool_calls for e in heard.of("twin")]


@pytest.mark.parametrize("fail_mode", ["open", "closed"])
def test_a_raising_reporter_never_stops_the_other_reporters_and_halts_the_live_call_only_failing_closed(fail_mode):
    class Broken:
        @tg.hookimpl
        def turnguard_shadow_detected(self, event):
            raise RuntimeError("reporter bug")

        @tg.hookimpl
        def turnguard_shadow_turn_ended(self, summary):
            raise RuntimeError("reporter bug")

    heard = Heard()
    tight = {"soft_cap": 1, "stuck_repeat_threshold": 2}
    config = tg.GuardConfig(**LIVE_ONLY, fail_mode=fail_mode, shadow={"tight": tight})
    guard = tg.Guard(config, plugins={"broken": Broken(), "heard": heard}, environ={})
    with guard.turn() as turn:
        verdicts = drive(turn, [distinct_call(1)] * 3)
    assert heard.of("tight") and "tight" in heard.ended
    if fail_mode == "open":
        assert turn.halted is None and all(v.action is not tg.Action.HALT for v in verdicts)
    else:  # as any observer's failure: the call it was heard on halts
        assert verdicts[-1] is turn.halted and len(verdicts) == heard.of("tight")[0].tool_calls
        assert turn.halted.message.endswith("failed in turnguard_shadow_detected (fail_mode=closed)")


def test_a_raising_shadow_policy_is_its_own_would_be_halt_and_never_the_hosts(monkeypatch):
    def broken(turn, call):
        raise RuntimeError("policy bug")

    guard, heard = shadow_guard({"open": {"fail_mode": "open"}, "closed": {}}, fail_mode="closed")
    plugin = guard.pm.get_plugin("shadow")
    for policy in plugin.policies:
        monkeypatch.setattr(policy.dispatcher, "check_call", (Impl("broken", broken, False, None),))
    with guard.turn() as turn:
        verdicts = drive(turn, [distinct_call(i) for i in range(3)])
    assert turn.halted is None and all(v.action is tg.Action.ALLOW for v in verdicts)
    assert heard.of("open") == [] and not heard.ended["open"].halted
    assert heard.ended["closed"].halted and heard.ended["closed"].tool_calls == 1


@pytest.mark.parametrize("step", ["begin_cycle", "count_call", "record_outcome"])
def test_a_failing_shadow_ledger_stops_the_shadows_not_the_host_in_each_check_hook(monkeypatch, step):
    """The shadows' three check hooks (cycle, call, outcome) each keep their own copy of the
    isolation: a bug in any of them stops the shadows, at that step, and never reaches the host."""
    guard, heard = shadow_guard({"twin": {}}, fail_mode="closed")
    original = getattr(Ledger, step)

    def broken(ledger: Ledger, *args):
        if ledger.config is not guard.config and ledger.tool_calls == 2:
            raise RuntimeError("a bug in the shadow's ledger")
        return original(ledger, *args)

    monkeypatch.setattr(Ledger, step, broken)
    verdicts = []
    with guard.turn() as turn:
        for first in (0, 2):
            verdicts.append(turn.begin_cycle())
            verdicts += drive(turn, [distinct_call(first + i) for i in range(2)])
    assert turn.halted is None and all(v.action is tg.Action.ALLOW for v in verdicts)
    assert turn.summary.tool_calls == 4
    assert heard.ended["twin"].tool_calls == 2  # it stopped counting at the failure


def test_parallel_calls_reach_every_shadow_once():
    guard, heard = shadow_guard({"twin": {}, "stale": {"stuck_signal": "stale_repeat"}})
    with guard.turn() as turn:
        def worker(base: int) -> None:
            for i in range(200):
                call = distinct_call(base + i)
                turn.check_call(call)
                turn.record_outcome(call, tg.Outcome.OK)

        threads = [threading.Thread(target=worker, args=(k * 1000,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert turn.summary.tool_calls == 800
    assert heard.ended["twin"].tool_calls == heard.ended["stale"].tool_calls == 800
    assert heard.ended["twin"].distinct_keys == 800


def test_a_turn_dropped_without_ending_leaves_no_shadow_state():
    import gc

    guard, _ = shadow_guard({"twin": {}})
    turn = guard.turn()
    turn.check_call(distinct_call(1))
    plugin = guard.pm.get_plugin("shadow")
    assert len(plugin._turns) == 1
    del turn
    gc.collect()
    assert plugin._turns == {}


def test_core_only_fixture_leaves_the_shadow_plugin_out():
    guard = tg.Guard(tg.GuardConfig(**CORE_ONLY, shadow={"a": {}}), environ={})
    assert guard.pm.get_plugin("shadow") is None


def play(turn: tg.Turn, rng: random.Random) -> list[tuple]:
    """A random unattended host on ``turn``: batches with identical calls as one object checked
    again, outcomes in any order through the checked object or a new one with its call_id,
    reported also after a HALT for the calls that ran. What the live turn counted, in order."""
    heard: list[tuple] = []
    loop, n = rng.sample(POOL, rng.choice((2, 3))), 0
    while n < 40 and turn.halted is None:
        if turn.halted is None:
            heard.append(("cycle",))
        turn.begin_cycle()
        batch: list[tg.ToolCall] = []
        for _ in range(rng.choice((1, 2, 3))):
            if batch and rng.random() < 0.35:
                call = rng.choice(batch)  # the same call again in one response
            else:
                n += 1
                name, args = loop[n % len(loop)] if rng.random() < 0.7 else rng.choice(POOL)
                call = tg.ToolCall(name, args, call_id=f"c{n}")
            if turn.halted is not None:
                break
            heard.append(("check", call))
            if turn.check_call(call).action is tg.Action.HALT:
                break
            batch.append(call)
        rng.shuffle(batch)
        for call in batch:
            if rng.random() < 0.05:
                continue  # its outcome never comes
            reported = call if rng.random() < 0.7 else tg.ToolCall(call.name, call.args, call.call_id)
            outcome, result = rng.choice(("ok", "error", "error", "denied")), rng.choice(("a", "a", "b", None))
            heard.append(("outcome", call, reported is call, outcome, result))
            turn.record_outcome(reported, outcome, result=result)
    return heard


def replay(turn: tg.Turn, heard: list[tuple]) -> None:
    """``heard`` on another turn, whatever it answers (each call its own object there)."""
    own: dict[tg.ToolCall, tg.ToolCall] = {}
    for step in heard:
        if step[0] == "cycle":
            turn.begin_cycle()
            continue
        call = step[1]
        mine = own.setdefault(call, tg.ToolCall(call.name, call.args, call.call_id))
        if step[0] == "check":
            turn.check_call(mine)
        else:
            reported = mine if step[2] else tg.ToolCall(call.name, call.args, call.call_id)
            turn.record_outcome(reported, step[3], result=step[4])


@pytest.mark.parametrize("seed", range(300))
def test_a_shadow_reports_what_its_configuration_decides_live_on_the_traffic_it_heard(seed):
    """The live guard has an explicit cap or not; the shadow is configured like it, or without
    its cap, or with another. Played on the live guard (one object checked several times in a
    batch, outcomes that come after the live HALT), the same traffic played on a guard of the
    shadow's configuration gives the shadow's would-be detections and summary."""
    rng = random.Random(seed)
    live = {**TWIN, "streak_stop_on": rng.choice(("error", "any")), "max_tool_calls_per_turn": rng.choice((None, 5, 9))}
    shadow = {**live, "max_tool_calls_per_turn": rng.choice((live["max_tool_calls_per_turn"], None, 4, 12))}
    guard, heard = shadow_guard({"shadow": shadow}, **live)
    with guard.turn() as turn:
        traffic = play(turn, rng)
    alone, alone_heard = shadow_guard((), **shadow)
    with alone.turn() as other:
        replay(other, traffic)
    assert events_view(heard.of("shadow")) == events_view(alone_heard.live)
    mine, theirs = heard.ended["shadow"], other.summary
    fields = ("halted", "threshold", "tool_calls", "detections", "cycles")
    if not theirs.halted:  # (a would-be halt stops a shadow's ledger; a halted live one still counts outcomes)
        fields += ("max_key_repeat", "max_failing_streak", "stuck")
    assert [getattr(mine, f) for f in fields] == [getattr(theirs, f) for f in fields]
