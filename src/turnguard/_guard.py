"""``Guard`` and ``Turn``: the lifecycle a host drives, and how plugin verdicts are combined.

A ``Turn`` records facts in its ledger and asks the check hooks under one lock, so calls are
counted, and streaks formed, in the order they were checked. An outcome belongs to the call that
was checked (the same ``ToolCall`` object, or one with its ``call_id``): a parallel batch gets
the verdicts of the same sequence run one call at a time, whatever order its outcomes arrive in.
A second outcome for one call, or one for a call never checked, changes nothing: it returns
ALLOW and is reported through ``turnguard_outcome_ignored`` (a host error).

Plugins are called through the guard's ``Dispatcher`` (``turnguard._dispatch``): each in
isolation, the most severe verdict wins, ties go to the first detection in hook order, a HALT
latches until the turn ends. Under ``fail_mode="closed"`` a plugin that fails, check or
observer, halts the call it failed on; one that fails in ``turnguard_configure`` halts every
turn opened afterwards (``turnguard.hookspecs`` says what each hook without a call does).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeGuard

import pluggy

from turnguard._config import ConfigError, GuardConfig, Probe
from turnguard._dispatch import NOTHING, Dispatcher, Found, Observer, observer_impls
from turnguard._driver import CHECK_CALL, CHECK_CYCLE, CHECK_OUTCOME, Driver, summarize
from turnguard._keys import (
    KEY_CHECK,
    KEY_DIGEST,
    KEY_KEYER,
    KEY_RESULT,
    KEY_TOKEN,
    NO_CHECK,
    CallKey,
    Keyer,
    store_key,
    turn_keyer,
)
from turnguard._ledger import GIVE_UP_AFTER, Ledger, LedgerView, answered_digest, overdue
from turnguard._model import (
    ALL_TOOLS,
    ALLOW,
    MAX_ID_LENGTH,
    Action,
    Answer,
    IgnoredOutcome,
    LoopDetected,
    LoopDetectedEvent,
    Outcome,
    ToolCall,
    TurnSummary,
    Verdict,
    id_text,
)
from turnguard._plugins import MAIN_HALTS_PLUGIN, plugin_manager
from turnguard._probe import Cohort
from turnguard._snapshot import (
    Lineage,
    SnapshotError,
    TurnState,
    Waiting,
    cohort_of,
    continued_checks,
    decided_config,
    deciding_settings,
    lineage_of,
    plugin_states,
    restore,
    resume_plugins,
    write,
)
from turnguard._task_results import Ended, ResultBook, ResultStatus
from turnguard.hookspecs import hookimpl

_HALT = Action.HALT
SUSPENDED = "suspended"
"""The end reason of a turn put aside to be resumed (``Turn.suspend``): not reported as a turn here."""


class Guard:
    """Holds the configuration, the key function and the plugin manager; opens turns.

    ``tracer_provider``/``meter_provider``/``logger_provider`` go to the OpenTelemetry plugin
    (the globals are used when omitted). Pass ``plugin_manager`` to use a manager you built
    (``turnguard._plugins.plugin_manager`` makes one); ``plugins`` are registered on top. With a
    probe (``GuardConfig.probe``), probe turns are opened by a second guard under the probe's
    configuration, built with turnguard's own manager and the same ``plugins`` and providers.
    """

    def __init__(
        self,
        config: GuardConfig | None = None,
        *,
        plugins: Mapping[str, object] | None = None,
        plugin_manager: pluggy.PluginManager | None = None,
        tracer_provider: Any = None,
        meter_provider: Any = None,
        logger_provider: Any = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.config = config if config is not None else GuardConfig()
        if not isinstance(self.config, GuardConfig):
            raise TypeError(f"config must be a turnguard.GuardConfig, got {type(self.config).__name__}")
        self.keyer = Keyer(self.config.key_mode, self.config.digest_key)
        providers = {
            "tracer_provider": tracer_provider,
            "meter_provider": meter_provider,
            "logger_provider": logger_provider,
        }
        self.pm = plugin_manager or _default_manager(self.config, providers, environ)
        for name, plugin in (plugins or {}).items():
            self.pm.register(plugin, name=name)
        if plugins:
            self.pm.check_pending()  # a plugin given in code with an unknown hook is a host error
        self.dispatcher = self._dispatcher()  # a wrapper on a check hook is refused here, not when a turn opens
        self.setup_failed: Verdict | None = None
        """Under ``fail_mode="closed"``, the HALT every turn starts with once a plugin failed to configure."""
        self._configure(self.dispatcher.observers("turnguard_configure"))
        self.cohort = Cohort.LIVE
        """The cohort of the turns this guard opens itself (a probe guard's are ``probe``)."""
        self.result_tools = result_tools(self.config)
        """The tools whose results a turn keys (``"*"``: every tool's); empty in most guards."""
        self.results = ResultBook(edges=(self.config.soft_cap, self.config.hard_cap),
                                  digest_key=self.config.digest_key)
        """Recently ended turns for late results, and the count of each ``ResultStatus``."""
        self.lineage = Lineage()
        """The turn ids this guard's snapshots and resumes used (a second resume of one snapshot forks)."""
        self._probe_setup = (plugins, environ, providers)
        self._registered: list[tuple[object, str | None]] = []
        """The plugins ``register`` added, for the probe guards made later (``_decided_probe_guard``)."""
        self._decided: OrderedDict[str, Guard] = OrderedDict()
        """The probe guards made to resume probe turns decided under another configuration, by it."""
        self._decided_lock = threading.Lock()
        self._probe = self.config.probe_settings()
        self._probe_guard: Guard | None = None
        if self._probe is not None and self._probe.rate > 0:
            self._probe_guard = self._new_probe_guard(probe_guard_config(self.config, self._probe))

    def _new_probe_guard(self, config: GuardConfig) -> Guard:
        """A guard opening probe turns under ``config`` beside this one: the same plugins and
        providers, this guard's results book and lineage."""
        plugins, environ, providers = self._probe_setup
        guard = Guard(config, plugins=plugins, environ=environ, **providers)
        guard.cohort = Cohort.PROBE
        guard.results = self.results
        guard.register(MainHalts(self.results, self.config.name), name=MainHalts.NAME)
        guard.lineage = self.lineage
        for plugin, name in self._registered:
            guard.register(plugin, name=name)
        return guard

    def _dispatcher(self) -> Dispatcher:
        return Dispatcher(self.pm, fail_mode=self.config.fail_mode, capture_content=self.config.capture_content)

    def _configure(self, observers: tuple[Observer, ...]) -> None:
        """``turnguard_configure`` for each implementation, isolated: a plugin that raises here is
        logged and reported, never fatal to ``Guard()`` (the hook is historic in spirit: plugins
        registered later through ``Guard.register`` get it too). Under ``fail_mode="closed"`` no
        call is under way to halt: every turn this guard opens afterwards starts halted."""
        failure = self.dispatcher.call_each("turnguard_configure", observers, None, {"config": self.config})[1]
        if failure is not None and self.setup_failed is None:
            self.setup_failed = failure

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register a plugin (takes effect for turns opened afterwards: register plugins through
        here, not on ``pm`` directly, so the dispatcher is rebuilt); a plugin implementing a hook
        turnguard does not have, or wrapping a check hook, is refused with
        ``pluggy.PluginValidationError``."""
        registered = self.pm.register(plugin, name=name)
        try:
            self.pm.check_pending()
            self.dispatcher = self._dispatcher()
        except pluggy.PluginValidationError:
            self.pm.unregister(plugin)
            raise
        self._configure(observer_impls(self.pm, "turnguard_configure", plugin))
        with self._decided_lock:  # (a probe guard made from now on registers it itself)
            self._registered.append((plugin, name))
            probe_guards = [guard for guard in (self._probe_guard, *self._decided.values()) if guard is not None]
        for probe_guard in probe_guards:
            probe_guard.register(plugin, name=name)
        return registered

    def turn(
        self,
        *,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        promptable: bool = False,
        turn_id: str | None = None,
        durable: bool = False,
    ) -> Turn:
        """Open a turn; use it as a context manager (leaving the block ends it). With a probe
        configured, a deterministic share of turns (by conversation, else turn id) is opened under
        the probe configuration (``turn.summary.cohort == "probe"``). ``turn_id=None`` gets a random
        id; any other is kept, ``0`` and ``""`` too: a late result and probe sampling reach a turn
        by its id's text.

        ``durable=True``: the turn's snapshot resumes in any process (``Guard.resume``), with the
        default configuration: without ``digest_key``, the turn keys its calls under a key of its
        own (BLAKE2b), which its snapshot carries. Other turns key calls with the process's own
        secret, a third of the cost, and resume only there (or wherever the same ``digest_key``
        is set)."""
        guard = self
        probe, probe_guard = self._probe, self._probe_guard
        if probe_guard is not None:
            assert probe is not None  # (a probe guard is made for a probe)
            turn_id = uuid.uuid4().hex if turn_id is None else turn_id
            if probe.selects(conversation_id, turn_id):
                guard = probe_guard
        return Turn(
            guard, conversation_id=conversation_id, agent_name=agent_name, promptable=promptable, turn_id=turn_id,
            durable=durable,
        )

    def report_result(self, turn_id: Any, resolved: bool) -> bool:
        """Report whether an ended turn's task succeeded (a user's verdict, a CI run later on):
        ``True`` when taken. ``turn_id`` is the id of a turn this guard (or its probe) ended, or a
        ``turn.result_token`` from any guard in any process with the same ``digest_key``: it is
        reported as the turn's own guard would report it (without a key, anyone can make a token:
        its labels show only values the metrics show already, ``_token`` otherwise, and a token's
        result never takes the place of a turn this guard ran). A second result for a turn (the
        first stands), an unknown or expired turn, a non-bool, an id that is no string or integer,
        a token that is garbled, truncated or forged, or a result after ``shutdown()`` is ignored
        and counted (``results.counts``, the ``turnguard.turn.results`` metric), never raised."""
        status, entry, labels = self.results.report(turn_id, resolved)
        owner = entry.guard if entry is not None else self
        if labels is not None:
            reported_id = labels.turn_id
        else:
            text = id_text(turn_id)
            reported_id = text[:MAX_ID_LENGTH] if text is not None and status is not ResultStatus.INVALID_TOKEN else ""
        owner.dispatcher.notify("turnguard_turn_result", None, turn_id=reported_id,
                                summary=entry.summary if entry is not None else None,
                                resolved=resolved if type(resolved) is bool else None, status=status.value,
                                labels=labels)
        return status is ResultStatus.ACCEPTED

    def shutdown(self) -> None:
        """Stop taking results, in a turn or later, by id or token (later ones are counted as
        ``after_shutdown``); turns still work. The probe's turns share this guard's results book,
        so they stop taking results too."""
        self.results.close()

    def resume(self, state: Any) -> Turn:
        """Continue the turn ``state`` (a ``Turn.snapshot()``) was taken from, with the verdicts it
        would have given had it never stopped, its shadows' included (a probe turn under the probe
        configuration); ``tg.SnapshotError`` naming what is wrong when this guard cannot.

        The turn keeps its id, unless this guard holds a turn of that id already (the same
        snapshot resumed twice, or a turn that went on after it): then it gets an id of its own
        and ``summary.resumed_from`` names the snapshot's.

        A probe turn stays in the probe cohort, under the configuration it was decided with,
        whatever this guard's probe is now (off, another rate, another configuration): turns in
        flight are not lost when the probe changes (``_decided_probe_guard``). A probe guard
        (``turn.guard`` of a probe turn) resumes its own cohort's turns itself."""
        if cohort_of(state) != Cohort.PROBE or self.cohort is Cohort.PROBE:
            return Turn(self, restored=restore(self, state))
        if self._probe_guard is not None:
            try:
                return Turn(self._probe_guard, restored=restore(self._probe_guard, state))
            except SnapshotError as exc:
                if not (exc.field or "").startswith("config."):
                    raise
        guard = self._decided_probe_guard(state)
        return Turn(guard, restored=restore(guard, state))

    def _decided_probe_guard(self, state: Mapping[str, Any]) -> Guard:
        """A probe guard under the settings a probe turn's snapshot was decided with
        (``decided_config``) over this guard's probe configuration (the probe's default one, the
        main configuration's settings, when the probe is off), made once per configuration;
        ``SnapshotError`` (``config``) when they cannot be taken."""
        probe = self._probe
        if probe is None:
            probe = self.config.replace(probe=Probe(1.0, GuardConfig())).probe_settings()
            assert probe is not None  # (just set)
        try:
            config = decided_config(probe_guard_config(self.config, probe), state.get("config"))
        except ConfigError as exc:
            raise SnapshotError(f"the probe turn cannot resume under this guard's configuration: {exc}",
                                "config") from None
        settings = json.dumps(deciding_settings(config), sort_keys=True, default=repr)
        with self._decided_lock:
            guard = self._decided.get(settings)
            if guard is None:
                guard = self._decided[settings] = self._new_probe_guard(config)
                if len(self._decided) > MAX_DECIDED_GUARDS:
                    self._decided.popitem(last=False)
            return guard


class MainHalts:
    """On a probe guard: notes where the main configuration (the shadow named after it) would have
    halted each probe turn, in the results book, so that the turn's late result (and its token)
    carry it as ``turnguard.probe.main_threshold``."""

    NAME = MAIN_HALTS_PLUGIN

    def __init__(self, results: ResultBook, main: str) -> None:
        self.results = results
        self.main = main

    @hookimpl
    def turnguard_shadow_turn_ended(self, turn: LedgerView, policy: str, summary: TurnSummary) -> None:
        if policy == self.main and summary.halted:
            self.results.main_halted(turn.turn_id, str(summary.threshold), summary.tool_calls)


def result_tools(config: GuardConfig) -> frozenset[str]:
    """The tools whose results a turn under ``config`` keys: its own ``stateful_tools`` and its
    shadows' (``"*"``: every tool), or every tool when the recorder keeps result digests."""
    if config.recorder_results:
        return frozenset((ALL_TOOLS,))
    return frozenset(config.stateful_tools).union(*(c.stateful_tools for _, c in config.shadow_configs()))


MAX_DECIDED_GUARDS = 8
"""The most probe guards a guard keeps for probe turns decided under other configurations."""

PROBE_INHERITS = ("digest_key", "recorder_path")
"""Settings a probe configuration takes from the main one when it leaves them ``None``."""


def probe_guard_config(main: GuardConfig, probe: Probe) -> GuardConfig:
    """The probe guard's configuration: the probe's, with the main configuration beside it as a
    shadow named after it (so its would-be detections are recorded where they would have fired)
    and the main configuration's own shadows. Deployment settings the probe configuration leaves
    unset (``PROBE_INHERITS``) are the main one's: a call has one digest in both cohorts, and probe
    turns are recorded where live turns are (calibrate's probe evidence reads them there)."""
    shadows = ((main.name, main.replace(probe=None, shadow=())),
               *((name, c.replace(probe=None)) for name, c in main.shadow_configs()))
    names = [name for name, _ in shadows]
    if len(set(names)) != len(names):
        raise ConfigError("shadow", main.name, "shadow names other than the policy's own name (with a probe, the "
                                               "main configuration runs as a shadow named after it)")
    unset = {key: getattr(main, key) for key in PROBE_INHERITS if getattr(probe.config, key) is None}
    return probe.config.replace(shadow=shadows, **unset)



def _default_manager(config: GuardConfig, providers: dict[str, Any], environ: Mapping[str, str] | None):
    return plugin_manager(config, providers=providers, environ=environ)


class CheckCall(Protocol):
    """The type of ``Turn.check_call``."""

    def __call__(self, call: ToolCall) -> Verdict: ...


class RecordOutcome(Protocol):
    """The type of ``Turn.record_outcome``."""

    def __call__(self, call: ToolCall, outcome: Outcome | str, result: Any = None) -> Verdict: ...


@dataclasses.dataclass(frozen=True, eq=False, slots=True)
class KeyToken:
    """What marks the keys a turn stored on its calls: the turn's marker and id only, so a plugin
    holding a call reaches no part of the turn through it, and a turn that continues it in this
    process knows its keys (``Turn._of_lineage``). Compared by identity for the turn's own keys."""

    marker: bytes
    """The turn's own marker, the last of its ``TurnState.lineage``."""
    turn_id: str
    origin: tuple[KeyToken, int] | None = None
    """An object checked again after a snapshot of a turn that had checked it: that earlier key's
    token and check (the first such), so every turn continuing that snapshot still knows the
    object as the call it checked there (``Turn._known_check``), whichever turn checked it again."""


class Turn:
    """One agent turn. All methods are thread-safe and never raise because of tool arguments."""

    def __init__(
        self,
        guard: Guard,
        *,
        conversation_id: str | None = None,
        agent_name: str | None = None,
        promptable: bool = False,
        turn_id: str | None = None,
        durable: bool = False,
        restored: TurnState | None = None,
    ) -> None:
        """``restored``: what a snapshot held (``Guard.resume``): the turn continues it."""
        self.guard = guard
        self.config = config = guard.config
        if restored is not None:
            ledger, keyer, durable = restored.ledger, restored.keyer, restored.durable
        else:
            ledger = Ledger(config, turn_id=turn_id, conversation_id=conversation_id, agent_name=agent_name,
                            promptable=promptable, cohort=guard.cohort)
            keyer = turn_keyer(config.key_mode) if durable and not config.digest_key else guard.keyer
        self.ledger = ledger
        self.durable = bool(durable)
        """Whether the turn's snapshot resumes in any process (``Guard.turn(durable=True)``)."""
        self._resolved: bool | None = None
        self.view = view = LedgerView(ledger)
        """The read-only view of the ledger that plugins receive as ``turn``."""
        self._keyer = keyer
        self._digest = keyer.digest
        self._lock = threading.RLock()
        self._acquire, self._release = self._lock.acquire, self._lock.release
        self._halt: Verdict | None = guard.setup_failed
        self._ended: TurnSummary | None = None
        self._lineage, self._until = lineage, until = lineage_of(restored)
        self._continued = continued_checks(lineage, until)
        self._token = KeyToken(lineage[-1], ledger.turn_id)
        self._awaiting: dict[int, ToolCall] = {}
        """Checked calls without an outcome yet, by sequence number (in check order)."""
        self._reused = False
        """Whether one ``ToolCall`` object was checked again while it still waited for an outcome."""
        self._restored: dict[int, tuple[int, ToolCall]] | None = None
        """A resumed turn's stand-ins for the calls that were waiting when its snapshot was taken,
        by check number, each with the check its object's key named there (``Waiting.named``):
        the object, reported or checked again in this process, takes their place (``_adopt``);
        else an outcome is matched by ``call_id``, or by the call's identity (``_claim_restored``)."""
        self._tracked = False
        """Whether the guard's ``lineage`` knows this turn's id (snapshotted or resumed)."""
        self._dispatch = dispatch = guard.dispatcher
        self._keyed_results = bool(ledger.names_tools or guard.result_tools)
        """Whether this turn looks at results (its stateful tools, its shadows', the recorder's)."""
        self._driver = driver = Driver(dispatch, ledger, view, report=view)
        """Counts, tests the quiet region, collects and combines (``turnguard._driver``)."""
        self._quiet = driver.quiet
        """Where the plugins cannot fire (``turnguard._firing.Quiet``): they are not called there."""
        self._call_observers = dispatch.bound(dispatch.call_observers, ledger, view)
        self._outcome_observers = dispatch.bound(dispatch.outcome_observers, ledger, view)
        self._observe_cycle = bool(dispatch.observers("turnguard_cycle_checked"))
        self.check_call, self.record_outcome = self._checker(), self._recorder()
        self._latch_failure(self._notify("turnguard_turn_started", turn=view), ALLOW)
        if restored is not None:
            self._continue_from(restored)

    # -- identity --------------------------------------------------------------------------

    @property
    def turn_id(self) -> str:
        return self.ledger.turn_id

    @property
    def promptable(self) -> bool:
        return self.ledger.promptable

    @property
    def halted(self) -> Verdict | None:
        """The latched HALT verdict, or ``None`` while the turn may go on."""
        return self._halt

    @property
    def summary(self) -> TurnSummary | None:
        """How the turn ended, once it has."""
        return self._ended

    @property
    def resolved(self) -> bool | None:
        """The task result reported in the turn (``report_result``), or ``None`` while none was."""
        return self._resolved

    # -- the host's calls --------------------------------------------------------------------

    def begin_cycle(self) -> Verdict:
        """Before each model request (a re-sent request counts again)."""
        with self._lock:
            if self._halt is not None:
                return self._halt
            found = self._driver.cycle()
            verdict, events = self._combine(CHECK_CYCLE, found) if found else NOTHING
        failure = self._after(events) if events else None
        if self._observe_cycle:
            observed = self._notify("turnguard_cycle_checked", turn=self.view, verdict=verdict)
            failure = observed if failure is None else failure
        return verdict if failure is None else self._latch_failure(failure, verdict)

    # check_call and record_outcome are the hot path: each turn's own closures (_checker and
    # _recorder, below), set when the turn opens, so that what they read on every call
    # is a local cell, not an attribute of the turn. Their docstrings are the closures' own
    # (tests/test_guard_hot_paths.py checks that the two texts agree).

    check_call: CheckCall
    """Before executing ``call``: count it and decide. Do not execute it on HALT.

    Identical calls checked while earlier ones of their streak still wait for an outcome
    (one model response's batch) count those as failures for the stop level: in an
    unattended turn at most ``streak_stop_at`` of them run."""

    record_outcome: RecordOutcome
    """After executing ``call``: record how it went (``ok``/``error``/``denied``/``unknown``).

    ``call`` is the checked ``ToolCall`` or one with its ``call_id``. A second outcome for a
    call, or one for a call this turn never checked, changes nothing and returns ALLOW (the
    latched HALT once the turn is halted); it is reported as a host error.

    ``result``: what the call returned (any value: the tool's text, or the part that matters,
    such as a ``status`` field; ``None``: not given). For a ``stateful_tools`` tool it is keyed
    at once, with the call keying rules, and only its digest is kept: an identical call whose
    result changed is progress (``docs/polling.md``). Other tools' results are not even keyed,
    unless ``recorder_results`` or a shadow's ``stateful_tools`` asks for their digest. The
    value itself is never kept, exported, recorded or put in a snapshot."""

    # (Attribute loads there would add a tenth to a shell command's check: benchmarks/bench_core.py.)
    # Anything but "no plugin had anything to say" takes the turn's methods (_combine, _claim,
    # _ignored, the observers').

    def _checker(self) -> CheckCall:
        driver, ledger, quiet, awaiting = self._driver, self.ledger, self._quiet, self._awaiting
        digest_of, keyer, token, acquire, release = self._digest, self._keyer, self._token, self._acquire, self._release
        count, every_call, collect, view = driver.count, driver.checks.call, driver.collect1, self.view
        call_observers = self._call_observers
        at_digest, at_keyer = KEY_DIGEST, KEY_KEYER  # the key's positions as cells: a global costs more here

        def check_call(call: ToolCall) -> Verdict:
            """Before executing ``call``: count it and decide. Do not execute it on HALT.

            Identical calls checked while earlier ones of their streak still wait for an outcome
            (one model response's batch) count those as failures for the stop level: in an
            unattended turn at most ``streak_stop_at`` of them run."""
            if type(call) is not ToolCall:
                _require_call(call)
            key = call.key
            # computed here, once; record_outcome and the plugins reuse it
            digest = digest_of(call.name, call.args) if key is None or key[at_keyer] is not keyer else key[at_digest]
            acquire()  # acquire/release bound once: cheaper than `with` on the hot path
            try:
                if self._halt is not None:
                    return self._refused(call, key, digest)
                seq = count(digest, call.name)
                if key is None:
                    store_key(call, (digest, keyer, token, seq))
                else:
                    self._key_again(call, key, digest, seq)
                awaiting[seq] = call
                if not seq & 1023:  # every GIVE_UP_EVERY-th (1,024th) check: is a call overdue?
                    self._give_up_waiting()
                # Driver.call's quiet test, inlined (the hot path; tests/test_driver.py holds the two equal)
                if (ledger.tool_calls <= quiet.calls and ledger.streak_length < quiet.streak
                        and ledger.max_key_repeat < quiet.repeat) or quiet.reasked():
                    impls = quiet.call  # the plugins that cannot fire here are not called
                else:
                    impls = every_call
                if impls:
                    found = collect(CHECK_CALL, impls, view, call)
                    if found:
                        verdict, events = self._combine(CHECK_CALL, found)
                    elif call_observers:
                        verdict, events = NOTHING
                    else:
                        return ALLOW
                elif call_observers:
                    verdict, events = NOTHING
                else:
                    return ALLOW
            finally:
                release()
            return self._call_checked(call, verdict, events)

        return check_call

    def _recorder(self) -> RecordOutcome:
        driver, ledger, quiet, awaiting, view = self._driver, self.ledger, self._quiet, self._awaiting, self.view
        acquire, release, record, pop = self._acquire, self._release, ledger.record_outcome, awaiting.pop
        every_outcome, outcome_observers, collect = driver.checks.outcome, self._outcome_observers, driver.collect2
        # Where results count, a token no key holds sends every outcome to _claim_and_record.
        token = object() if self._keyed_results else self._token
        at_token, at_check = KEY_TOKEN, KEY_CHECK  # the key's positions as cells: a global costs more here

        def record_outcome(call: ToolCall, outcome: Outcome | str, result: Any = None) -> Verdict:
            """After executing ``call``: record how it went (``ok``/``error``/``denied``/``unknown``).

            ``call`` is the checked ``ToolCall`` or one with its ``call_id``. A second outcome for a
            call, or one for a call this turn never checked, changes nothing and returns ALLOW (the
            latched HALT once the turn is halted); it is reported as a host error.

            ``result``: what the call returned (any value: the tool's text, or the part that matters,
            such as a ``status`` field; ``None``: not given). For a ``stateful_tools`` tool it is keyed
            at once, with the call keying rules, and only its digest is kept: an identical call whose
            result changed is progress (``docs/polling.md``). Other tools' results are not even keyed,
            unless ``recorder_results`` or a shadow's ``stateful_tools`` asks for their digest. The
            value itself is never kept, exported, recorded or put in a snapshot."""
            verdict: Verdict
            events: Sequence[LoopDetectedEvent]
            if type(call) is not ToolCall:
                _require_call(call)
            if type(outcome) is not Outcome:
                outcome = Outcome.parse(outcome)
            acquire()
            try:
                key = call.key
                checked = pop(key[at_check], None) if key is not None and key[at_token] is token else None
                if checked is call:
                    seq = key[at_check]
                    due = record(seq, outcome)  # true: an ended streak's stop count was reached
                else:
                    seq, call, due = self._claim_and_record(call, outcome, result, checked)
                if seq:
                    if self._halt is not None:
                        verdict, events = self._outcome_after_halt(call, outcome, due)
                    else:
                        # Driver.outcome's quiet test, inlined (as above)
                        impls = quiet.outcome if ledger.stop_count < quiet.stop_count and not due else every_outcome
                        if not impls and not outcome_observers:
                            return ALLOW
                        found = collect(CHECK_OUTCOME, impls, view, call, outcome) if impls else ()
                        if found:
                            verdict, events = self._combine(CHECK_OUTCOME, found)
                        elif outcome_observers:
                            verdict, events = NOTHING
                        else:
                            return ALLOW
            finally:
                if self._reused:  # once the check hooks read the settled check off the key
                    self._next_check_of(call)
                release()
            if not seq:
                return self._ignored(call, outcome)
            return self._outcome_recorded(call, outcome, verdict, events)

        return record_outcome

    def _outcome_after_halt(self, call: ToolCall, outcome: Outcome, due: bool | None) -> tuple[Verdict, tuple[()]]:
        """An outcome of a call checked before the HALT latched (under the lock): the ledger counted
        it, so the check hooks hear it too (the shadows then see the outcomes the live turn saw),
        but a halted turn's answer stands: what they return is dropped, their detections with it."""
        driver, ledger = self._driver, self.ledger
        quiet = driver.quiet
        impls = quiet.outcome if ledger.stop_count < quiet.stop_count and not due else driver.checks.outcome
        if impls:
            driver.collect2(CHECK_OUTCOME, impls, self.view, call, outcome)
        assert self._halt is not None  # (the caller's test)
        return self._halt, ()

    def _refused(self, call: ToolCall, key: CallKey | None, digest: bytes) -> Verdict:
        """A check after the HALT latched (under the lock): the latched HALT; the call is not
        counted and waits for nothing. A call no turn keyed is keyed as checked here under no check
        (``NO_CHECK``): its outcome (a host error) is then ignored in a resumed turn as in the
        turn that never stopped, never taken for a snapshot's waiting identical call's
        (``_claim_restored`` takes only objects no turn checked)."""
        if key is None or key[KEY_TOKEN] is None:
            store_key(call, (digest, self._keyer, self._token, NO_CHECK))
        assert self._halt is not None  # (the caller's test)
        return self._halt

    def _names_check(self, key: CallKey | None) -> TypeGuard[CallKey]:
        """Whether ``key`` names a check this turn counted (not one refused after its HALT). A key
        a turn this one continues stored (this process: its objects) names one too: in a resumed
        turn that turn's checks are this one's, so its objects' second reports are duplicates here
        as there, never reports of other calls sharing their ``call_id`` (``_claim``)."""
        if key is None:
            return False
        if key[KEY_TOKEN] is self._token:  # (the usual case, on every report: no call needed)
            return key[KEY_CHECK] != NO_CHECK
        return self._known_check(key) != NO_CHECK

    def _known_check(self, key: CallKey) -> int:
        """The check of this turn a key names (``NO_CHECK``: none): its own (also under a token
        of its own made for an object checked again, ``_rekeyed``), a turn's it continues
        (``_of_lineage``), or, for an object another turn checked again after the snapshot this
        turn continues, the check the key's ``origin`` names there."""
        token, check = key[KEY_TOKEN], key[KEY_CHECK]
        if type(token) is not KeyToken or check == NO_CHECK:
            return NO_CHECK
        if token is self._token or token.marker == self._token.marker or self._of_lineage(token, check):
            return check
        origin = token.origin
        return origin[1] if origin is not None and self._of_lineage(*origin) else NO_CHECK

    def _lineage_check(self, key: CallKey) -> int:
        """``_known_check`` for a key this turn did not store: a check of a turn it continues."""
        token = key[KEY_TOKEN]
        if type(token) is not KeyToken or token.marker == self._token.marker:
            return NO_CHECK
        return self._known_check(key)

    def _rekeyed(self, key: CallKey) -> KeyToken:
        """The token for an object checked again here whose key is ``key``: this turn's, carrying
        the first check of a snapshot's turn the key names (``KeyToken.origin``), so that the
        other turns continuing that snapshot still know the object as theirs."""
        token = key[KEY_TOKEN]
        if type(token) is not KeyToken or key[KEY_CHECK] == NO_CHECK or (token is self._token and not self._tracked):
            return self._token  # (no snapshot taken or resumed: no other turn continues this one's checks)
        if token.marker == self._token.marker and token is not self._token:
            return token  # (this turn's already, carrying its origin)
        origin = token.origin if token.origin is not None else (token, key[KEY_CHECK])
        return KeyToken(self._token.marker, self._token.turn_id, origin)

    def _of_lineage(self, token: object, check: int) -> bool:
        """Whether a key (its token and check) names a check of a turn this one continues, up to
        where it continues it (``TurnState.lineage`` and ``until``: its snapshots' turns, along
        every resume and fork), which is this turn's check too; never an unrelated turn's of the
        same id, nor a fork's or a sibling's (each resume has a marker of its own), nor one the
        snapshot's turn made after the snapshot. After a snapshot without a lineage: the
        snapshot's turn's (its id or ``resumed_from``), as before lineages were written."""
        return type(token) is KeyToken and (check <= self._continued.get(token.marker, -1)
                                            or token.turn_id in self._snapshot_ids)

    def _key_again(self, call: ToolCall, key: CallKey, digest: bytes, seq: int) -> None:
        """A checked call that carries a key already: this turn's, still waiting for its outcome
        (checked again: the key keeps its first check), the snapshot's this turn resumed, still
        waiting (``_adopt``: likewise), or another's (its token and check number are another turn's;
        a key stored by ``Keyer.key_of`` has neither)."""
        if self._awaiting.get(key[KEY_CHECK]) is call and self._names_check(key):
            self._reused = True
        elif self._restored and self._adopt(call):
            self._reused = True  # (checked before the snapshot, and its outcome has not come)
        else:
            store_key(call, (digest, self._keyer, self._rekeyed(key), seq))

    def _call_checked(self, call: ToolCall, verdict: Verdict, events: Any) -> Verdict:
        """After a check, outside the lock: the detections' and ``turnguard_call_checked``'s observers."""
        failure = self._after(events) if events else None
        if self._call_observers:
            observed = self._dispatch.notify2("turnguard_call_checked", self._call_observers, self.view, call, verdict)
            failure = observed if failure is None else failure
        return verdict if failure is None else self._latch_failure(failure, verdict)

    def _outcome_recorded(self, call: ToolCall, outcome: Outcome, verdict: Verdict, events: Any) -> Verdict:
        """After an outcome, outside the lock: the detections' and ``turnguard_outcome_recorded``'s observers."""
        failure = self._after(events) if events else None
        if self._outcome_observers:
            observed = self._dispatch.notify3("turnguard_outcome_recorded", self._outcome_observers, self.view,
                                              call, outcome, verdict)
            failure = observed if failure is None else failure
        return verdict if failure is None else self._latch_failure(failure, verdict)

    def retry(self) -> None:
        """The current model request is being re-sent: roll its calls back, clear repeats and streaks.

        Call ``begin_cycle()`` again before re-sending (the re-sent request counts as a cycle).
        Outcomes still to come for the rolled-back calls are accepted and change no streak. A
        halted turn is over: a retry changes nothing there (its counts stand, as its summary and
        the figures built on it report them).
        """
        with self._lock:
            if self._halt is not None:
                return
            self.ledger.rollback_cycle()
        self._latch_failure(self._notify("turnguard_retry", turn=self.view), ALLOW)

    def resolve(self, event: LoopDetectedEvent | Verdict, answer: Answer | str) -> Verdict:
        """The user's answer to an ASK: ``continue`` or ``redirect`` reset the streak so it does
        not fire again on the next call; ``stop`` latches HALT. Every answer is reported."""
        asked = event.event if isinstance(event, Verdict) else event
        if not isinstance(asked, LoopDetectedEvent):
            raise TypeError("resolve() takes the LoopDetectedEvent (verdict.event) of the ASK being answered")
        try:
            answer = Answer(str(answer).lower())
        except ValueError:
            raise ValueError(f"unknown answer {answer!r}; pass one of 'continue', 'stop', 'redirect'") from None
        with self._lock:
            if answer is Answer.STOP:
                if self._halt is None:
                    self._halt = Verdict(Action.HALT, asked.threshold, "turnguard: stopped by the user", asked)
            else:
                self.ledger.reset_streak(answered_digest(asked))
            verdict = self._halt or ALLOW
        failure = self._notify("turnguard_escalation_resolved", turn=self.view, event=asked, response=answer.value)
        return self._latch_failure(failure, verdict)

    def halt(self, verdict: Verdict, message: str | None = None) -> Verdict:
        """The host halts the turn itself on a detection (e.g. an ASK with nobody to ask):
        latch a HALT with the verdict's threshold and event, so later checks and the summary agree."""
        if not isinstance(verdict, Verdict):
            raise TypeError("halt() takes the turnguard.Verdict the host is acting on")
        with self._lock:
            if self._halt is None:
                self._halt = Verdict(Action.HALT, verdict.threshold, message or verdict.message, verdict.event)
            return self._halt

    def end(self, reason: str = "completed") -> TurnSummary:
        """Close the turn (idempotent); observers get a ``TurnSummary``. ``reason="suspended"``
        puts the turn aside instead (see ``suspend``)."""
        with self._lock:
            if self._ended is not None:
                return self._ended
            summary = self._close(reason)
        self._report_end(summary)
        return summary

    def suspend(self, pending: Verdict | None = None) -> dict[str, Any]:
        """Put the turn aside to be resumed (``Guard.resume``, here or in another process: open it
        with ``durable=True`` for that): returns its snapshot (``snapshot(pending)``) and closes it
        as ``suspended``, in one step. A suspended turn is not an ended one: no turn is reported
        here (no ``turnguard_turn_ended``, so no turn metric point, no recorder line, no slot for
        a late result; ``turnguard_turn_suspended`` instead); the turn that resumes it reports it,
        once, when it ends. ``ValueError`` when the turn has ended otherwise already."""
        with self._lock:
            ended = self._ended
            if ended is not None and ended.reason != SUSPENDED:
                raise ValueError(f"the turn has ended ({ended.reason}): there is nothing to suspend")
            state = self.snapshot(pending)
            summary = self._close(SUSPENDED) if ended is None else None
        if summary is not None:
            self._report_end(summary)
        return state

    def _close(self, reason: str) -> TurnSummary:
        """The turn's summary, kept as how it ended (under the lock)."""
        if self._halt is not None and reason == "completed":
            reason = "halted"
        summary = summarize(self.ledger, reason, self._halt, final=reason != SUSPENDED)
        if reason != SUSPENDED:  # (put aside, the levels wait in the snapshot for the resumed turn)
            self._unreported = self._driver.unreported()
        if self._resolved is not None:
            summary = dataclasses.replace(summary, resolved=self._resolved)
        self._ended = summary
        self._awaiting.clear()  # outcomes after the end are strays: the calls are not kept alive
        self._restored = None
        if self._tracked:
            self.guard.lineage.closed(self.turn_id, suspended=reason == SUSPENDED)
        return summary

    def _report_end(self, summary: TurnSummary) -> None:
        """Tell the guard and the observers how the turn closed (outside the lock)."""
        if summary.reason == SUSPENDED:
            self._notify("turnguard_turn_suspended", turn=self.view, summary=summary)
            return
        if self._unreported:  # (the turn has ended: an observer's failure has nothing left to halt)
            self._after(self._unreported)
        self._book_entry = self.guard.results.ended(summary, self.guard, self.config.name)
        self._notify("turnguard_turn_ended", turn=self.view, summary=summary)

    @property
    def result_token(self) -> str | None:
        """Once the turn has ended, its result token (``None`` before, and for a turn whose id does
        not fit in one): ``guard.report_result(token, resolved)`` on any guard with the same
        ``digest_key``, in any process, reports the turn's result as this guard would. ASCII, at
        most ``MAX_ID_LENGTH`` characters, versioned; the turn id and its labels (cohort, policy,
        call count, what ended it, agent), never arguments (``turnguard._task_results``)."""
        summary = self._ended
        if summary is None or summary.reason == SUSPENDED:  # put aside: the turn that finishes it has one
            return None
        if self._result_token is None:
            self._result_token = self.guard.results.token_for(self._book_entry)
        return self._result_token

    _result_token: str | None = None
    _unreported: Sequence[LoopDetectedEvent] = ()
    """The detections reached that no report carried, told as the turn ends (``Driver.unreported``)."""
    _lineage: tuple[bytes, ...]
    """The markers of the turns this one continues, its own last (``TurnState.lineage``)."""
    _until: tuple[int | None, ...]
    """Where this turn continues each turn of its lineage but itself (``TurnState.until``)."""
    _continued: dict[bytes, int]
    """The last check this turn continues of each turn of its lineage but itself, by marker."""
    _token: KeyToken
    """Marks the keys this turn stored on its calls (``call.key[KEY_TOKEN]``)."""
    _snapshot_ids: frozenset[str] = frozenset()
    """A turn resumed from a snapshot without a lineage: the ids of the turns whose keys name checks
    of this one (the snapshot's turn's, in this process: ``_of_lineage``)."""
    _book_entry: Ended | None = None
    """What the results book keeps of the turn once it ended (``ResultBook.ended``)."""

    def report_result(self, resolved: bool) -> bool:
        """Report whether the turn's task succeeded, before or after it ends (then it is
        ``Guard.report_result``): ``True`` when taken. A second result, a non-bool, or a result
        after ``guard.shutdown()`` is ignored and counted, never raised."""
        with self._lock:
            ended = self._ended is not None
            if not ended:
                status = (ResultStatus.AFTER_SHUTDOWN if self.guard.results.closed
                          else ResultStatus.INVALID if not isinstance(resolved, bool)
                          else ResultStatus.DUPLICATE if self._resolved is not None else ResultStatus.ACCEPTED)
                if status is ResultStatus.ACCEPTED:
                    self._resolved = resolved
        if ended:
            return self.guard.report_result(self.turn_id, resolved)
        if status is not ResultStatus.ACCEPTED:
            self.guard.results.count(status)
            self._notify("turnguard_turn_result", turn_id=id_text(self.turn_id) or "", summary=None,
                         resolved=resolved if isinstance(resolved, bool) else None, status=status.value, labels=None)
        return status is ResultStatus.ACCEPTED

    def snapshot(self, pending: Verdict | None = None) -> dict[str, Any]:
        """The turn's state as versioned JSON data, for ``Guard.resume`` (``pending``: an ASK the
        host is still waiting on the user for; see ``turnguard._snapshot``). It resumes in any
        process when the turn is ``durable``, else only here or where the same ``digest_key`` is
        set. Taking one does not end the turn: ``suspend`` does both."""
        with self._lock:
            data = write(self._state(), self.config, pending)
            if not self._tracked:  # its id is in use here from now on (a resume of this snapshot forks)
                self._tracked = True
                self.guard.lineage.opened(self.turn_id)
                if self._ended is not None:
                    self.guard.lineage.closed(self.turn_id, suspended=self._ended.reason == SUSPENDED)
        return data

    def raise_for(self, verdict: Verdict) -> Verdict:
        """Raise ``LoopDetected`` on HALT; return the verdict otherwise (for hosts that abort by raising)."""
        if verdict.action is Action.HALT:
            raise LoopDetected(verdict)
        return verdict

    def __enter__(self) -> Turn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.end()
        elif isinstance(exc, LoopDetected):
            self.end("halted")
        else:
            self.end("error")

    # -- internals ---------------------------------------------------------------------------

    def _state(self) -> TurnState:
        """What the turn's snapshot holds of it (under the lock)."""
        stand_ins = self._restored or {}
        awaiting = []
        for seq, call in self._awaiting.items():
            key: CallKey = call.key
            stood = stand_ins.get(seq)
            if stood is not None and stood[1] is call:
                named = stood[0]
            else:  # (an object another turn keyed again names no check here)
                named = key[KEY_CHECK] if self._names_check(key) else seq
            awaiting.append(Waiting(seq, call.name, call.call_id, key[KEY_DIGEST], named))
        return TurnState(self.ledger, self._keyer, self.durable, self._resolved, awaiting, self._halt,
                         plugin_states(self._dispatch, self.view), self._lineage, self._until)

    def _continue_from(self, restored: TurnState) -> None:
        """Take back what a snapshot held beside the ledger (``Guard.resume``): the calls still
        waiting for an outcome, the latched halt, a result reported already, the plugins' state. A
        plugin that refuses its state puts the turn aside (unreported: the snapshot stays the turn's
        to resume) and raises its ``SnapshotError``."""
        self._tracked = True
        ledger = restored.ledger
        if restored.lineage is None:
            self._snapshot_ids = frozenset(i for i in (ledger.turn_id, ledger.resumed_from) if i is not None)
        refused, failure = None, None
        with self._lock:
            stand_ins = {}
            for entry in restored.awaiting:
                call = ToolCall(entry.name, None, entry.call_id)  # found by its object, call_id, or digest
                store_key(call, (entry.digest, self._keyer, self._token, entry.seq))
                self._awaiting[entry.seq] = call
                stand_ins[entry.seq] = (entry.named, call)
            self._restored = stand_ins
            self._halt = restored.halt or self._halt  # (or the fail-closed halt of its opening)
            self._resolved = restored.resolved
            try:
                failure = resume_plugins(self._dispatch, self.view, restored.plugins)
            except SnapshotError as exc:
                refused = exc
        if refused is not None:
            self.end(SUSPENDED)
            raise refused
        if failure is not None:  # a plugin could not take its state back: under fail_mode="closed" the turn halts
            self._latch_failure(failure, ALLOW)

    def _claim(self, call: ToolCall) -> tuple[int, ToolCall]:
        """The earliest check still waiting for an outcome that ``call`` reports (the same object,
        or the same ``call_id``), taken off the waiting list: (sequence number, the checked call);
        (0, ``call``) when there is none (a duplicate or a stray). An object this turn checked whose
        check no longer waits reports only its own other waiting checks: its second report is a
        duplicate, never the outcome of another call that shares its ``call_id`` (one checked after
        the HALT counted no check: ``_refused``)."""
        call_id = call.call_id
        key: CallKey | None = call.key
        if call_id is not None and self._names_check(key):
            check = key[KEY_CHECK] if key[KEY_TOKEN] is self._token else self._known_check(key)
            call_id = call_id if check in self._awaiting else None
        for seq, checked in self._awaiting.items():
            if checked is call or (call_id is not None and checked.call_id == call_id):
                del self._awaiting[seq]
                return seq, checked
        if self._restored:
            return self._claim_restored(call)
        return 0, call

    def _claim_restored(self, call: ToolCall) -> tuple[int, ToolCall]:
        """A waiting call of the snapshot this turn resumed, without a ``call_id``, that ``call``, a
        new object (the host's, for that call, in this process or another), reports: the earliest
        with its name and digest; as ``_claim``. An object a turn checked is not one of them (its own
        checks took it in, ``_adopt``: this is a duplicate or another turn's call), nor a report
        with a ``call_id`` (``_claim`` looked for its id already)."""
        key: CallKey | None = call.key
        if call.call_id is not None or (key is not None and key[KEY_TOKEN] is not None):
            return 0, call
        restored, awaiting = self._restored or {}, self._awaiting
        digest = self._digest(call.name, call.args)
        for seq, (_, checked) in list(restored.items()):
            if awaiting.get(seq) is not checked:  # given up since (MAX_AWAITING), or its object took it
                del restored[seq]
            elif checked.call_id is None and checked.name == call.name and checked.key[KEY_DIGEST] == digest:
                del restored[seq], awaiting[seq]
                return seq, checked
        return 0, call

    def _adopt(self, call: ToolCall) -> bool:
        """Whether ``call`` is an object checked before the snapshot this turn resumed (this
        process: its key is a turn's of this lineage, naming the check it named there) with checks
        still waiting: then it takes their stand-ins' places and its key becomes this turn's,
        naming the same check, so its outcomes settle its checks in order, as had the turn never
        stopped (first outcome, first check)."""
        key: CallKey | None = call.key
        if key is None or (named := self._lineage_check(key)) == NO_CHECK:
            return False
        awaiting, stand_ins = self._awaiting, self._restored or {}
        own = [seq for seq, (its_named, stood) in stand_ins.items()
               if its_named == named and awaiting.get(seq) is stood and stood.name == call.name
               and stood.call_id == call.call_id and stood.key[KEY_DIGEST] == key[KEY_DIGEST]]
        if not own:
            return False
        for seq in own:
            awaiting[seq] = call  # (the check keeps its place in check order)
            del stand_ins[seq]
        check = named if named in own else own[0]
        token = key[KEY_TOKEN]
        if token.origin is not None and not self._of_lineage(token, key[KEY_CHECK]):
            token = token.origin[0]  # (another turn checked it again: the key of the turn it continues)
        store_key(call, (key[KEY_DIGEST], self._keyer, token, check, *key[KEY_RESULT:]))
        if len(own) > 1:
            self._reused = True
        return True

    def _put_back(self, seq: int, checked: ToolCall) -> None:
        """The hot path took check ``seq`` off the waiting list for a report through another object
        (one carrying the checked call's key): it waits again, in check order."""
        awaiting = self._awaiting
        awaiting[seq] = checked
        items = sorted(awaiting.items())  # (check numbers are unique: no two calls are compared)
        awaiting.clear()  # in place: the hot paths hold this dict
        awaiting.update(items)

    def _next_check_of(self, call: ToolCall) -> None:
        """In a turn where an object was checked more than once, after an outcome (settled or
        ignored): when ``call``'s key names a check of this turn that no longer waits, it now
        points at the call's next waiting check (with the settled outcome's result, for the
        observers). Done once the check hooks ran: until then the key names the settled check
        (the shadows credit the outcome by it)."""
        key: CallKey | None = call.key
        if not self._names_check(key) or self._known_check(key) in self._awaiting:
            return
        for seq, checked in self._awaiting.items():
            if checked is call:
                token = key[KEY_TOKEN] if self._of_lineage(key[KEY_TOKEN], seq) else self._rekeyed(key)
                store_key(call, (key[KEY_DIGEST], key[KEY_KEYER], token, seq, *key[KEY_RESULT:]))
                return

    def _give_up_waiting(self) -> None:
        """Stop waiting for the calls ``overdue`` names (looked at every ``GIVE_UP_EVERY``-th check;
        most looks end at the first test)."""
        awaiting = self._awaiting
        old = self.ledger.checks - GIVE_UP_AFTER
        if len(awaiting) <= GIVE_UP_AFTER and (not awaiting or next(iter(awaiting)) > old):
            return
        items = list(awaiting.items())
        shed = overdue([seq for seq, _ in items], self.ledger.checks)
        for seq, _ in items[:shed]:
            self.ledger.abandon(seq)
        awaiting.clear()  # in place: the hot paths hold this dict
        awaiting.update(items[shed:])

    def _claim_and_record(self, call: ToolCall, outcome: Outcome, result: Any,
                          taken: ToolCall | None = None) -> tuple[int, ToolCall, bool | None]:
        """The hot path's other way (under the lock): the check ``call`` reports (``_claim``; at
        once when it is the object checked, as on the hot path) and its outcome recorded; (0,
        ``call``, None) for a report no check waits for. In a turn where results count
        (``_keyed_results``) every outcome comes here, with its result (``_record_result``).
        ``taken``: the call the hot path took off the waiting list by ``call``'s key, when that was
        another object (``call`` carries its key): it waits again."""
        key: CallKey | None = call.key
        if taken is not None:
            self._put_back(key[KEY_CHECK] if key is not None else 0, taken)
        if self._restored and self._adopt(call):
            key = call.key
        if key is not None and self._awaiting.get(key[KEY_CHECK]) is call and self._names_check(key):
            seq = key[KEY_CHECK]
            del self._awaiting[seq]
        else:
            seq, call = self._claim(call)
        if not seq:
            return 0, call, None
        if self._keyed_results:
            return seq, call, self._record_result(seq, call, outcome, result)
        return seq, call, self.ledger.record_outcome(seq, outcome)

    def _record_result(self, seq: int, call: ToolCall, outcome: Outcome, result: Any) -> bool | None:
        """``Ledger.record_outcome`` where results count: the result of a tool whose results are
        keyed here (``Guard.result_tools``) becomes its digest, kept on the call's key
        (``keys.cached_result``: for the recorder and the shadows), and a stateful tool's call is
        recorded with it (``Ledger.record_polled``)."""
        name, digest = call.name, None
        key: CallKey = call.key
        if result is not None:
            tools = self.guard.result_tools
            if ALL_TOOLS in tools or name in tools:
                digest = self._digest(name, result)
        if digest is not None:
            store_key(call, (*key[:KEY_RESULT], digest))
        elif len(key) > KEY_RESULT:  # the result of an earlier check of this object
            store_key(call, key[:KEY_RESULT])
        return self._driver.record(seq, name, outcome, digest)

    def _ignored(self, call: ToolCall, outcome: Outcome) -> Verdict:
        if self._ended is not None:
            reason = IgnoredOutcome.AFTER_END
        else:
            reason = IgnoredOutcome.DUPLICATE if self._names_check(call.key) else IgnoredOutcome.UNKNOWN_CALL
        failure = self._notify("turnguard_outcome_ignored", turn=self.view, call=call, outcome=outcome,
                               reason=reason.value)
        return self._latch_failure(failure, self._halt or ALLOW)

    def _combine(
        self, hook: str, found: Found
    ) -> tuple[Verdict, tuple[LoopDetectedEvent, ...] | list[LoopDetectedEvent]]:
        """``Driver.combine`` for this turn; a HALT latches."""
        best, events = self._driver.combine(hook, found)
        if best is None:
            return ALLOW, events
        if best.action is _HALT:
            self._halt = best
        return best, events

    def _after(self, events: Any) -> Verdict | None:
        """``turnguard_loop_detected`` for each event: the first failure's stand-in, if any."""
        if not self._dispatch.observers("turnguard_loop_detected"):  # (no telemetry: nobody to tell)
            return None
        failure = None
        for event in events:
            observed = self._notify("turnguard_loop_detected", turn=self.view, event=event)
            failure = observed if failure is None else failure
        return failure

    def _notify(self, hook: str, **kwargs: Any) -> Verdict | None:
        """Call an observer hook, each implementation isolated: the first failure's stand-in
        (``Dispatcher.failed``: a HALT under ``fail_mode="closed"``), else ``None``."""
        return self._dispatch.notify(hook, self.view, **kwargs)

    def _latch_failure(self, failure: Verdict | None, verdict: Verdict) -> Verdict:
        """What the host gets from a call whose observers may have failed: ``verdict``, unless
        ``failure`` is a failure's stand-in (a HALT, under ``fail_mode="closed"``): then the turn
        halts, from the call it failed on, and the latched HALT is returned."""
        if failure is None:
            return verdict
        with self._lock:
            if self._halt is None:
                self._halt = failure
            return self._halt


def _require_call(call: Any) -> None:
    if not isinstance(call, ToolCall):
        raise TypeError(f"pass a turnguard.ToolCall(name, args), not {type(call).__name__}")
