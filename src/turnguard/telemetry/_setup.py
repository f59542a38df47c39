"""``configure()``: OpenTelemetry SDK providers from the standard ``OTEL_*`` environment variables.

For hosts without an OpenTelemetry setup of their own (and the CLI). It builds a tracer, meter and
logger provider exporting over OTLP and returns them in a ``Telemetry``; pass that to
``Guard(**telemetry.providers())``. It installs them as the global providers only when asked
(``set_global=True``): a library must not take over the host's globals.

Variables read (an explicit argument wins over the variable):

- ``OTEL_SDK_DISABLED=true``: no-op providers, nothing exported.
- ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES`` (``k=v,k2=v2``).
- ``OTEL_EXPORTER_OTLP_ENDPOINT`` (default ``http://localhost:4318`` for HTTP, ``:4317`` for gRPC)
  and the per-signal ``OTEL_EXPORTER_OTLP_{TRACES,METRICS,LOGS}_ENDPOINT`` (used as given).
- ``OTEL_EXPORTER_OTLP_PROTOCOL`` (and per signal): ``http/protobuf`` (default) or ``grpc``.
- ``OTEL_EXPORTER_OTLP_HEADERS`` (and per signal): ``k=v,k2=v2``, values URL-decoded.
- ``OTEL_EXPORTER_OTLP_TIMEOUT`` (and per signal): milliseconds, default 10000.
- ``OTEL_{TRACES,METRICS,LOGS}_EXPORTER``: ``otlp`` (default), ``console`` or ``none``.
- ``OTEL_METRIC_EXPORT_INTERVAL`` (ms, default 60000); the batch processors'
  ``OTEL_BSP_*``/``OTEL_BLRP_*`` ``SCHEDULE_DELAY`` (ms), ``MAX_QUEUE_SIZE`` and
  ``MAX_EXPORT_BATCH_SIZE``; ``OTEL_METRICS_EXEMPLAR_FILTER``.

Every duration is 1 ms to a day, every size 1 to 2**31 - 1: a value the SDK would refuse is a
``TelemetryConfigError`` naming the variable, and so is one the SDK refuses among the variables it
reads itself (limits, compression: ``_refused``), before any export thread starts. An HTTP
compression the exporter cannot use is refused by turnguard itself (``HTTP_COMPRESSIONS``).

The OTLP span and log exporters sit behind a circuit breaker (``turnguard.telemetry._breaker``):
after a failed export, batches are dropped unencoded for 1 s, doubling up to 30 s, so a dead
collector costs the host next to nothing.

Shutdown is bounded: ``Telemetry.shutdown()`` flushes the three providers side by side and gives
up after ``shutdown_timeout_ms`` (default ``DEFAULT_SHUTDOWN_TIMEOUT_MS``, 1.5 s; also
``configure(shutdown_timeout_ms=...)`` or ``TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT`` in ms), leaving
an export still waiting on a dead or silent collector to its daemon thread. ``configure()`` runs
it at interpreter exit in place of the SDK's own unbounded exit hooks, so a process whose
collector is down exits within that bound whether or not it calls ``shutdown()``.
``Telemetry.force_flush(timeout_millis)`` is bounded the same way, and ``False`` unless every
export it waited for was accepted.

The metrics exporter is wrapped so that every cumulative point's start is at least a millisecond
before its sample (``turnguard.telemetry._starts``): Prometheus 3 keeps a series' start as a 0 only
then, and a one-shot process's series are exported in the millisecond they start.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, overload
from urllib.parse import unquote

from turnguard.telemetry._tally import ExportTally

PROTOCOLS = ("http/protobuf", "grpc")
SIGNALS = ("traces", "metrics", "logs")
EXPORTERS = ("otlp", "console", "none")
HTTP_COMPRESSIONS = ("none", "deflate", "gzip")
"""What the HTTP exporter can send with; it reads ``OTEL_EXPORTER_OTLP_*COMPRESSION`` itself and, since
SDK 1.45, sends another value uncompressed with a warning, so turnguard refuses it first."""
DEFAULT_HTTP_ENDPOINT = "http://localhost:4318"
DEFAULT_GRPC_ENDPOINT = "http://localhost:4317"
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_QUEUE = 2048
DEFAULT_EXPORT_BATCH = 512
OTLP_PACKAGE = "opentelemetry.exporter.otlp.proto"
SDK_MODULES = ("opentelemetry.sdk", OTLP_PACKAGE)  # what `pip install turnguard` lacks
DEFAULT_SHUTDOWN_TIMEOUT_MS = 1500
SHUTDOWN_TIMEOUT_ENV = "TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT"
"""Milliseconds ``Telemetry.shutdown()`` (and the exit hook) waits for the providers to flush."""
log = logging.getLogger("turnguard.telemetry")


class TelemetryConfigError(ValueError):
    """An ``OTEL_*`` variable (or argument) ``configure()`` cannot use: names it and what is accepted."""


@dataclasses.dataclass(frozen=True, slots=True)
class ExportSettings:
    """Where and how one signal is exported (resolved from arguments and the environment)."""

    signal: str
    exporter: str
    protocol: str
    endpoint: str
    headers: tuple[tuple[str, str], ...]
    timeout_s: float


PROVIDER_KEYWORDS = ("tracer_provider", "meter_provider", "logger_provider")
"""``Guard(...)``'s keyword arguments for the SDK providers."""


def provider_keywords(holder: Any) -> dict[str, Any]:
    """``Guard(...)``'s provider keywords from what holds the providers under those names
    (``Telemetry``, ``testing.InMemoryTelemetry``)."""
    return {name: getattr(holder, name) for name in PROVIDER_KEYWORDS}


@dataclasses.dataclass(frozen=True, slots=True)
class Telemetry:
    """The SDK providers ``configure()`` built; flush or shut them down when the host exits."""

    tracer_provider: Any
    meter_provider: Any
    logger_provider: Any
    settings: tuple[ExportSettings, ...] = ()
    shutdown_timeout_ms: int = DEFAULT_SHUTDOWN_TIMEOUT_MS
    """How long ``shutdown()`` waits for the providers to flush before giving up on them."""
    _stopped: threading.Event = dataclasses.field(default_factory=threading.Event, compare=False, repr=False)
    exports: ExportTally = dataclasses.field(default_factory=ExportTally, compare=False, repr=False)
    """The OTLP and metric exporters' failures: none after a ``shutdown()`` that returned ``True``
    means everything recorded was accepted by its destination."""

    def providers(self) -> dict[str, Any]:
        """Keyword arguments for ``Guard(...)``."""
        return provider_keywords(self)

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        """Export everything buffered now, the three providers side by side, waiting at most
        ``timeout_millis`` for them together; ``False`` when some did not finish in time (its
        export is left to its daemon thread) or an export failed meanwhile (the SDK's batch
        processors ignore the timeout and answer ``True`` whatever their export did)."""
        failed = self.exports.failed
        flushed = _side_by_side(_flush, self._providers(), timeout_millis / 1000, "turnguard-telemetry-flush")
        return all(flushed) and self.exports.failed == failed

    def shutdown(self, timeout_millis: int | None = None) -> bool:
        """Flush and stop every provider, waiting at most ``timeout_millis`` (default
        ``shutdown_timeout_ms``) for all of them together; ``False`` when some did not finish
        (its export is left to its daemon thread). Idempotent."""
        if self._stopped.is_set():
            return True
        self._stopped.set()
        with _LIVE_LOCK:
            if self in _LIVE:
                _LIVE.remove(self)
        timeout = (self.shutdown_timeout_ms if timeout_millis is None else timeout_millis) / 1000
        late = _side_by_side(_stop, self._providers(), timeout, "turnguard-telemetry-shutdown").count(False)
        if late:
            log.warning("turnguard telemetry: %d provider(s) did not flush within %.1f s (collector down?); "
                        "their data is dropped", late, timeout)
        return not late

    def _providers(self) -> tuple[Any, Any, Any]:
        return self.tracer_provider, self.meter_provider, self.logger_provider


_LIVE: list[Telemetry] = []
"""What ``configure()`` built and nobody shut down yet: shut down at interpreter exit."""
_LIVE_LOCK = threading.Lock()


@atexit.register
def _shutdown_at_exit() -> None:
    """Every live ``Telemetry`` shut down side by side, so the bound holds for all of them at once."""
    with _LIVE_LOCK:
        live = list(_LIVE)
    stops = [threading.Thread(target=t.shutdown, daemon=True) for t in live]
    for stop in stops:
        stop.start()
    deadline = time.monotonic() + max((t.shutdown_timeout_ms for t in live), default=0) / 1000 + 0.2
    for stop in stops:
        stop.join(max(0.0, deadline - time.monotonic()))


def _side_by_side(work: Callable[[Any, float], bool], providers: tuple[Any, ...], timeout_s: float,
                  name: str) -> list[bool]:
    """``work(provider, timeout_s)`` for every provider at once, each on a daemon thread, waiting
    at most ``timeout_s`` for all of them together: what each answered, ``False`` for one still
    working at the deadline (left to its thread: a dead collector cannot hold the caller)."""
    deadline = time.monotonic() + timeout_s
    answers = [False] * len(providers)

    def run(at: int, provider: Any) -> None:
        answers[at] = work(provider, timeout_s)

    threads = [threading.Thread(target=run, args=(at, provider), name=name, daemon=True)
               for at, provider in enumerate(providers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [answer and not thread.is_alive() for answer, thread in zip(answers, threads, strict=True)]


def _flush(provider: Any, timeout_s: float) -> bool:
    """Whether ``provider`` flushed (one without ``force_flush`` has nothing to flush)."""
    flush = getattr(provider, "force_flush", None)
    if flush is None:
        return True
    try:
        return bool(flush(timeout_s * 1000))
    except Exception:  # (the meter provider raises when a reader failed or timed out)
        log.debug("turnguard telemetry: flushing %s failed", type(provider).__name__, exc_info=True)
        return False


def _stop(provider: Any, timeout_s: float) -> bool:
    """Shut ``provider`` down; ``True`` once it returned (its failure is logged, not raised)."""
    stop = getattr(provider, "shutdown", None)
    if stop is None:
        return True
    try:
        if isinstance(provider, _sdk_meter_provider()):
            stop(timeout_millis=timeout_s * 1000)
        else:
            stop()
    except Exception:  # a provider failing to stop must not keep the others or the host from exiting
        log.warning("turnguard telemetry: shutting down %s failed", type(provider).__name__, exc_info=True)
    return True


def _sdk_meter_provider() -> type:
    from opentelemetry.sdk.metrics import MeterProvider

    return MeterProvider


def configure(
    *,
    service_name: str | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_ms: int | None = None,
    set_global: bool = False,
    environ: Mapping[str, str] | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    shutdown_timeout_ms: int | None = None,
) -> Telemetry:
    """SDK providers for traces, metrics and logs, exporting over OTLP per the ``OTEL_*`` variables.

    ``environ`` defaults to ``os.environ``. With ``set_global=True`` the providers also become the
    process-wide globals (which OpenTelemetry lets a process set once). ``shutdown_timeout_ms``
    (else ``TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT``, else 1500) bounds ``Telemetry.shutdown()``,
    which also runs at interpreter exit.
    """
    env = os.environ if environ is None else environ
    if _flag(env, "OTEL_SDK_DISABLED"):
        return _disabled()
    _require_sdk()
    if shutdown_timeout_ms is None:
        shutdown_timeout_ms = shutdown_timeout_from(env)
    elif isinstance(shutdown_timeout_ms, bool) or not 0 <= shutdown_timeout_ms <= MAX_MS:
        raise TelemetryConfigError(f"shutdown_timeout_ms={shutdown_timeout_ms!r}: expected 0 to {MAX_MS} ms")
    settings = tuple(
        resolve(signal, env, endpoint=endpoint, protocol=protocol, headers=headers, timeout_ms=timeout_ms)
        for signal in SIGNALS
    )
    span_batch, log_batch = _batch(env, "OTEL_BSP_", 5000), _batch(env, "OTEL_BLRP_", 1000)
    interval = _ms(env, "OTEL_METRIC_EXPORT_INTERVAL", 60_000)
    exports = ExportTally()
    with _sdk_refusals(env):  # (the SDK reads variables of its own, some as it is imported)
        resource = _resource(env, service_name, resource_attributes)
        tracer_provider, meter_provider, logger_provider = _providers(resource, settings, env, span_batch, log_batch,
                                                                      interval, exports)
    telemetry = Telemetry(tracer_provider, meter_provider, logger_provider, settings, int(shutdown_timeout_ms),
                          exports=exports)
    with _LIVE_LOCK:
        _LIVE.append(telemetry)
    if set_global:
        install_global(telemetry)
    return telemetry


def shutdown_timeout_from(env: Mapping[str, str]) -> int:
    """``TURNGUARD_TELEMETRY_SHUTDOWN_TIMEOUT`` (ms, 0 to a day), else the default; a
    ``TelemetryConfigError`` naming it when it is not one (every CLI command checks it)."""
    return _ms(env, SHUTDOWN_TIMEOUT_ENV, DEFAULT_SHUTDOWN_TIMEOUT_MS, least=0)


def _resource(env: Mapping[str, str], service_name: str | None, resource_attributes: Mapping[str, Any] | None) -> Any:
    """The SDK resource: ``OTEL_RESOURCE_ATTRIBUTES``, then the given attributes, then the service name."""
    from opentelemetry.sdk.resources import Resource

    attributes: dict[str, Any] = _pairs(env.get("OTEL_RESOURCE_ATTRIBUTES", ""), "OTEL_RESOURCE_ATTRIBUTES")
    attributes.update(resource_attributes or {})
    name = service_name or env.get("OTEL_SERVICE_NAME") or attributes.get("service.name")
    if name:
        attributes["service.name"] = name
    return Resource.create(attributes)


def _providers(resource: Any, settings: tuple[ExportSettings, ...], env: Mapping[str, str], span_batch: dict[str, Any],
               log_batch: dict[str, Any], interval_ms: int, exports: ExportTally) -> tuple[Any, Any, Any]:
    """The three SDK providers, each exporting through its signal's exporter (an OTLP span or log
    exporter behind the circuit breaker, with a batch processor; a periodic reader for metrics),
    every OTLP and metric export's result counted in ``exports``.

    What reads ``OTEL_*`` variables of its own (the exporters: compression; the providers:
    attribute and event limits) is built before any processor or reader starts a thread: a value
    the SDK refuses is a ``TelemetryConfigError`` naming it (``_refused``), nothing left running."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from turnguard.telemetry._breaker import BreakerLogRecordExporter, BreakerSpanExporter
    from turnguard.telemetry._starts import SeparateStartsExporter

    exemplar_filter = _exemplar_filter(env)
    built: list[Any] = []
    try:
        span_exporter, metric_exporter, log_exporter = (_kept(built, _exporter(s)) for s in settings)
        # No SDK exit hooks (each waits up to 30 s on a dead collector): ours, bounded, replaces them.
        tracer_provider = _kept(built, TracerProvider(resource=resource, shutdown_on_exit=False))
        logger_provider = _kept(built, LoggerProvider(resource=resource, shutdown_on_exit=False))
    except BaseException:
        _shut(built)
        raise
    traces, _, logs = settings
    if span_exporter is not None:
        spans = BreakerSpanExporter(span_exporter, tally=exports) if traces.exporter == "otlp" else span_exporter
        tracer_provider.add_span_processor(BatchSpanProcessor(spans, **span_batch))
    if log_exporter is not None:
        records = BreakerLogRecordExporter(log_exporter, tally=exports) if logs.exporter == "otlp" else log_exporter
        logger_provider.add_log_record_processor(BatchLogRecordProcessor(records, **log_batch))
    readers = [] if metric_exporter is None else [
        PeriodicExportingMetricReader(SeparateStartsExporter(metric_exporter, exports),
                                      export_interval_millis=interval_ms)]
    meter_provider = MeterProvider(resource=resource, metric_readers=readers, shutdown_on_exit=False,
                                   exemplar_filter=exemplar_filter)
    return tracer_provider, meter_provider, logger_provider


def _kept(built: list[Any], thing: Any) -> Any:
    if thing is not None:
        built.append(thing)
    return thing


def _shut(built: list[Any]) -> None:
    """Close what was built before the SDK refused a setting (an exporter's session or channel)."""
    for thing in built:
        try:
            thing.shutdown()
        except Exception:  # (closing a half-built SDK: nothing to add to the refusal)
            log.debug("turnguard telemetry: closing %s failed", type(thing).__name__, exc_info=True)


EXEMPLAR_FILTERS = ("trace_based", "always_on", "always_off")
"""``OTEL_METRICS_EXEMPLAR_FILTER``'s values (the SDK's default first)."""


def _exemplar_filter(env: Mapping[str, str]) -> Any:
    """``OTEL_METRICS_EXEMPLAR_FILTER``, read here: the SDK reads it after the metric reader's
    thread started, and refuses an unknown value with a ``ValueError`` that does not name it."""
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, AlwaysOnExemplarFilter, TraceBasedExemplarFilter

    name = env.get("OTEL_METRICS_EXEMPLAR_FILTER", "").strip() or EXEMPLAR_FILTERS[0]
    filters: dict[str, Callable[[], Any]] = dict(zip(
        EXEMPLAR_FILTERS, (TraceBasedExemplarFilter, AlwaysOnExemplarFilter, AlwaysOffExemplarFilter), strict=True))
    if name not in filters:
        raise TelemetryConfigError(f"OTEL_METRICS_EXEMPLAR_FILTER={name!r}: expected one of {EXEMPLAR_FILTERS}")
    return filters[name]()


@contextlib.contextmanager
def _sdk_refusals(env: Mapping[str, str]) -> Iterator[None]:
    """A value the SDK refuses inside the block is a ``TelemetryConfigError`` (``_refused``)."""
    try:
        yield
    except (ImportError, TelemetryConfigError):
        raise
    except Exception as exc:
        raise _refused(exc, env) from exc


def _refused(exc: Exception, env: Mapping[str, str]) -> TelemetryConfigError:
    """A value the SDK refused while reading ``OTEL_*`` variables itself, as a
    ``TelemetryConfigError`` naming the variable: the one its message names, else the one whose
    value it quotes (``float('')`` of a blank timeout), else every ``OTEL_*`` variable set."""
    said = str(exc) or type(exc).__name__
    values = {var: text for var, text in {**os.environ, **env}.items() if var.startswith("OTEL_")}
    named = set(_OTEL_NAME.findall(said)) & values.keys() or {
        var for var, text in values.items() if not var.endswith("_HEADERS") and repr(text) in said}
    if len(named) == 1:
        var = named.pop()
        shown = "" if var.endswith("_HEADERS") else f"={values[var]!r}"  # (headers hold tokens)
        return TelemetryConfigError(f"{var}{shown}: the OpenTelemetry SDK refused it: {said}")
    return TelemetryConfigError(f"the OpenTelemetry SDK refused its settings ({type(exc).__name__}: {said}); the "
                                f"OTEL_* variables set: {', '.join(sorted(values)) or 'none'}")


_OTEL_NAME = re.compile(r"\bOTEL_[A-Z0-9_]+\b")


def _require_sdk() -> None:
    """The SDK and the OTLP exporters are the ``cli`` extra: the library alone has only the API."""
    for module in SDK_MODULES:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"turnguard.telemetry.configure() needs the OpenTelemetry SDK and the OTLP exporters "
                f'({module} is not installed): pip install "turnguard[otlp]"',
                name=module,
            )


def install_global(telemetry: Telemetry) -> None:
    """Make ``telemetry``'s providers the process-wide OpenTelemetry globals."""
    from opentelemetry import metrics, trace
    from opentelemetry._logs import set_logger_provider

    trace.set_tracer_provider(telemetry.tracer_provider)
    metrics.set_meter_provider(telemetry.meter_provider)
    set_logger_provider(telemetry.logger_provider)


def resolve(
    signal: str,
    env: Mapping[str, str],
    *,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout_ms: int | None = None,
) -> ExportSettings:
    """One signal's export settings: argument > per-signal variable > generic variable > default."""
    upper = signal.upper()
    exporter = (env.get(f"OTEL_{upper}_EXPORTER") or "otlp").strip().lower()
    if exporter not in EXPORTERS:
        raise TelemetryConfigError(f"OTEL_{upper}_EXPORTER={exporter!r}: expected one of {EXPORTERS}")
    source, proto = _first(("protocol", protocol), *_vars(env, f"OTEL_EXPORTER_OTLP_{upper}_PROTOCOL",
                                                       "OTEL_EXPORTER_OTLP_PROTOCOL"))
    proto = (proto or "http/protobuf").strip().lower()
    if proto not in PROTOCOLS:
        raise TelemetryConfigError(f"{source}={proto!r}: expected one of {PROTOCOLS}")
    if exporter == "otlp" and proto == "http/protobuf":
        _check_http_compression(env, upper)
    own = env.get(f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    if endpoint is not None or not own:
        source, base = _first(("endpoint", endpoint), *_vars(env, "OTEL_EXPORTER_OTLP_ENDPOINT"))
        base = (base or (DEFAULT_GRPC_ENDPOINT if proto == "grpc" else DEFAULT_HTTP_ENDPOINT)).strip()
        url = base if proto == "grpc" else base.rstrip("/") + f"/v1/{signal}"
    else:
        source, url = f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT", own.strip()
    if "://" not in url:
        raise TelemetryConfigError(
            f"{source}: OTLP endpoint {url!r} for {signal}: expected a URL such as {DEFAULT_HTTP_ENDPOINT}"
        )
    header_map = _pairs(env.get("OTEL_EXPORTER_OTLP_HEADERS", ""), "OTEL_EXPORTER_OTLP_HEADERS")
    header_map.update(_pairs(env.get(f"OTEL_EXPORTER_OTLP_{upper}_HEADERS", ""), f"OTEL_EXPORTER_OTLP_{upper}_HEADERS"))
    header_map.update(headers or {})
    if timeout_ms is None:
        timeout_ms = _ms(env, f"OTEL_EXPORTER_OTLP_{upper}_TIMEOUT", None)
        if timeout_ms is None:  # the per-signal variable wins whenever it is set
            timeout_ms = _ms(env, "OTEL_EXPORTER_OTLP_TIMEOUT", DEFAULT_TIMEOUT_MS)
    elif isinstance(timeout_ms, bool) or not isinstance(timeout_ms, int) or not 1 <= timeout_ms <= MAX_MS:
        raise TelemetryConfigError(f"timeout_ms={timeout_ms!r}: expected 1 to {MAX_MS} ms")
    return ExportSettings(signal, exporter, proto, url, tuple(sorted(header_map.items())), timeout_ms / 1000)


def _check_http_compression(env: Mapping[str, str], upper: str) -> None:
    """The value the HTTP exporter will read (its signal's variable, else the generic one) is one it can use."""
    source, compression = _first(*_vars(env, f"OTEL_EXPORTER_OTLP_{upper}_COMPRESSION",
                                        "OTEL_EXPORTER_OTLP_COMPRESSION"))
    if compression is not None and compression.strip().lower() not in HTTP_COMPRESSIONS:
        raise TelemetryConfigError(f"{source}={compression!r}: expected one of {HTTP_COMPRESSIONS}")


def _vars(env: Mapping[str, str], *names: str) -> list[tuple[str, str | None]]:
    return [(name, env.get(name)) for name in names]


def _first(*candidates: tuple[str, str | None]) -> tuple[str, str | None]:
    """The first ``(where, value)`` with a value (an argument, then variables), else ``("default", None)``."""
    return next(((where, value) for where, value in candidates if value), ("default", None))


def _exporter(s: ExportSettings) -> Any:
    if s.exporter == "none":
        return None
    if s.exporter == "console":
        return _console(s.signal)
    headers = dict(s.headers) or None
    if s.protocol == "grpc":
        insecure = s.endpoint.startswith("http://")
        return _otlp_exporter("grpc", s.signal)(endpoint=s.endpoint, insecure=insecure, headers=headers,
                                                timeout=s.timeout_s)
    return _otlp_exporter("http", s.signal)(endpoint=s.endpoint, headers=headers, timeout=s.timeout_s)


OTLP_EXPORTERS = {"traces": ("trace_exporter", "OTLPSpanExporter"),
                  "metrics": ("metric_exporter", "OTLPMetricExporter"),
                  "logs": ("_log_exporter", "OTLPLogExporter")}
"""By signal: the module (in ``OTLP_PACKAGE``'s ``grpc`` and ``http`` alike) and
the class of its OTLP exporter, imported only when one is configured."""


def _otlp_exporter(transport: str, signal: str) -> Callable[..., Any]:
    """The exporter class; each transport's package imported by name, so that tools that read
    imports (packagers, the extras' check in the tests) see which one is used."""
    module, name = OTLP_EXPORTERS[signal]
    if transport == "grpc":
        import opentelemetry.exporter.otlp.proto.grpc as grpc_package

        package = grpc_package.__name__
    else:
        import opentelemetry.exporter.otlp.proto.http as http_package

        package = http_package.__name__
    exporter: Callable[..., Any] = getattr(importlib.import_module(f"{package}.{module}"), name)
    return exporter


def _console(signal: str) -> Any:
    if signal == "traces":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if signal == "metrics":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    from opentelemetry.sdk._logs.export import ConsoleLogRecordExporter

    return ConsoleLogRecordExporter()


def _disabled() -> Telemetry:
    from opentelemetry._logs import NoOpLoggerProvider
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.trace import NoOpTracerProvider

    return Telemetry(NoOpTracerProvider(), NoOpMeterProvider(), NoOpLoggerProvider())


def _batch(env: Mapping[str, str], prefix: str, delay_ms: int) -> dict[str, Any]:
    """A batch processor's settings: ``<prefix>SCHEDULE_DELAY``, ``MAX_QUEUE_SIZE``, ``MAX_EXPORT_BATCH_SIZE``."""
    settings: dict[str, Any] = {"schedule_delay_millis": _ms(env, prefix + "SCHEDULE_DELAY", delay_ms)}
    queue = _count(env, prefix + "MAX_QUEUE_SIZE")
    batch = _count(env, prefix + "MAX_EXPORT_BATCH_SIZE")
    if queue is not None:
        settings["max_queue_size"] = queue
        batch = min(batch or DEFAULT_EXPORT_BATCH, queue)
    if batch is not None:
        if queue is None and batch > DEFAULT_QUEUE:
            raise TelemetryConfigError(
                f"{prefix}MAX_EXPORT_BATCH_SIZE={batch}: expected at most the queue size ({DEFAULT_QUEUE})"
            )
        settings["max_export_batch_size"] = batch
    return settings


def _flag(env: Mapping[str, str], var: str) -> bool:
    return env.get(var, "").strip().lower() in ("1", "true", "yes", "on")


def _count(env: Mapping[str, str], var: str) -> int | None:
    """A whole number of items (a queue or batch size) from 1 to ``MAX_COUNT``, or ``None`` when unset."""
    value = _number(env, var, int, 1, MAX_COUNT, f"a whole number from 1 to {MAX_COUNT}")
    return None if value is None else int(value)


MAX_COUNT = 2**31 - 1
"""The largest queue or batch size an ``OTEL_*`` variable may give (the range the specification asks
SDKs to support): the SDK sizes a ``deque`` with it, which a larger number overflows."""
MAX_MS = 24 * 3600 * 1000
"""The longest duration an ``OTEL_*`` variable may give (a day): a larger one, ``inf`` or ``nan``
is a ``TelemetryConfigError``, not an overflow in a timer."""


@overload
def _ms(env: Mapping[str, str], var: str, default: int, *, least: int = 1) -> int: ...
@overload
def _ms(env: Mapping[str, str], var: str, default: None, *, least: int = 1) -> int | None: ...
def _ms(env: Mapping[str, str], var: str, default: int | None, *, least: int = 1) -> int | None:
    """A whole number of milliseconds from ``least`` to ``MAX_MS`` (a fraction is cut), or ``default``.
    An ``OTEL_*`` duration is at least 1 ms: the SDK refuses a schedule delay or an export interval
    of 0 and cannot send an export within 0 ms."""
    value = _number(env, var, float, least, MAX_MS, f"a number of milliseconds from {least} to {MAX_MS}")
    return default if value is None else int(value)


def _number(env: Mapping[str, str], var: str, parse: Callable[[str], float], low: float, high: float,
            expected: str) -> float | None:
    """``var`` parsed and within ``[low, high]`` (``nan`` is not), ``None`` when unset or blank."""
    text = env.get(var, "").strip()
    if not text:
        return None
    try:
        value = parse(text)
    except ValueError:
        raise TelemetryConfigError(f"{var}={text!r}: expected {expected}") from None
    if not low <= value <= high:  # nan compares false
        raise TelemetryConfigError(f"{var}={text!r}: expected {expected}")
    return value


def _pairs(text: str, var: str) -> dict[str, str]:
    """``k=v,k2=v2`` (the W3C-baggage-like format of the OTEL_* list variables), URL-decoded."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise TelemetryConfigError(f"{var}: {item.strip()!r} is not key=value")
        pairs[unquote(key.strip())] = unquote(value.strip())
    return pairs
