"""A scripted model on 127.0.0.1 that speaks the wire formats of Claude Code (Anthropic Messages),
Codex (OpenAI Responses) and Gemini CLI (Gemini API), so the real CLIs run offline and every
request they make is kept for the test to inspect.

A script is the model: a sequence of replies (the n-th main request gets the n-th reply) or a
callable that picks the reply from the request. A reply is a final text (``str``) or a list of
``Call``; several calls in one reply are parallel calls. Side requests (Claude Code's small
title/summary requests without tools, Gemini's router and next-speaker checks, token counts,
unknown paths) get a harmless answer and do not consume the script. Every request is kept in
``ModelServer.requests``, so a test can count model requests and look for what the model was shown
(a hook's reason or reminder) in the request after a call."""

from __future__ import annotations

import gzip
import itertools
import json
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal
from urllib.parse import urlsplit

Api = Literal["anthropic", "openai", "gemini", "other"]
Agent = Literal["claude", "codex", "gemini"]

SHELL_TOOLS: dict[Agent, tuple[str, str]] = {
    "claude": ("Bash", "command"),
    "codex": ("exec_command", "cmd"),
    "gemini": ("run_shell_command", "command"),
}
"""Each agent's shell tool and the argument that carries the command line (as the pinned versions
offer them to the model)."""

EXHAUSTED = "Done: the script has no more replies."
"""The final text sent once a sequence script has run out, so a run always ends."""


@dataclass(frozen=True)
class Call:
    """One tool call the model makes."""

    name: str
    args: dict[str, Any]
    namespace: str | None = None
    """The tool namespace the call's function is in (Codex's sub-agent tools: ``CODEX_AGENTS``)."""


CODEX_AGENTS = "multi_agent_v1"
"""The namespace of Codex's sub-agent tools (``spawn_agent``, ``wait_agent``...), as 0.169 offers it."""


def codex_spawn(task: str) -> Call:
    """Codex's call that starts a sub-agent on ``task`` (its output names the new agent's id)."""
    return Call("spawn_agent", {"message": task}, CODEX_AGENTS)


def codex_wait(agent_ids: Sequence[str]) -> Call:
    """Codex's call that waits until one of the sub-agents ``agent_ids`` finishes."""
    return Call("wait_agent", {"targets": list(agent_ids), "timeout_ms": 120_000}, CODEX_AGENTS)


Reply = str | Call | Sequence[Call]
"""A final text, one call, or parallel calls."""


def shell(agent: Agent, command: str) -> Call:
    """A call of ``agent``'s own shell tool running ``command``."""
    name, arg = SHELL_TOOLS[agent]
    return Call(name, {arg: command})


@dataclass
class ModelRequest:
    """One HTTP request an agent made, as received (``body`` is the parsed JSON, or ``None``)."""

    api: Api
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    main: bool = False
    """Whether the request is an agent-loop request that the script answers."""
    index: int = -1
    """The position among main requests (0 for the first), -1 for side requests."""
    reply: Reply | None = None
    error: str | None = None

    def data(self) -> dict[str, Any]:
        """The body if it is a JSON object, else an empty one."""
        return self.body if isinstance(self.body, dict) else {}

    def text(self) -> str:
        """The whole body as JSON text, to look for a string anywhere the model would see it."""
        return json.dumps(self.body, ensure_ascii=False)

    def seen(self, needle: str) -> bool:
        return needle in self.text()

    def tool_names(self) -> list[str]:
        """The tools the agent offers the model in this request."""
        tools = self.data().get("tools") or []
        if self.api == "gemini":
            return [d["name"] for t in tools for d in t.get("functionDeclarations", [])]
        return [t.get("name") or t.get("function", {}).get("name", "") for t in tools]

    def tool_results(self) -> list[str]:
        """The results of the model's previous calls, as the last message hands them back."""
        return [text for _, text in self.tool_result_items()]

    def tool_result_items(self) -> list[tuple[str, str]]:
        """(call id, result text) for each result the request hands back for the model's last reply."""
        body = self.data()
        if self.api == "anthropic":
            last = (body.get("messages") or [{}])[-1]
            blocks = last.get("content") if last.get("role") == "user" else None
            return [(b.get("tool_use_id", ""), _flatten(b.get("content")))
                    for b in blocks or [] if isinstance(b, dict) and b.get("type") == "tool_result"]
        if self.api == "openai":
            items = body.get("input") or []
            calls: set[str] = set()
            for item in reversed(items):
                if item.get("type") == "function_call":
                    calls.add(item.get("call_id"))
                elif item.get("role") in ("user", "assistant") or (calls and item.get("role") != "developer"):
                    break
            return [(i.get("call_id", ""), _flatten(i.get("output"))) for i in items
                    if i.get("type") == "function_call_output" and i.get("call_id") in calls]
        if self.api == "gemini":
            last = (body.get("contents") or [{}])[-1]
            parts = last.get("parts") or [] if last.get("role") == "user" else []
            return [(p["functionResponse"].get("id") or p["functionResponse"].get("name", ""),
                     _flatten(p["functionResponse"].get("response"))) for p in parts if "functionResponse" in p]
        return []

    @property
    def step(self) -> int:
        """How many model replies the conversation already holds (0 on its first request): a
        callable script's position in a conversation, whichever conversation it is."""
        body = self.data()
        if self.api == "anthropic":
            return sum(m.get("role") == "assistant" for m in body.get("messages") or [])
        if self.api == "gemini":
            return sum(c.get("role") == "model" for c in body.get("contents") or [])
        if self.api == "openai":
            kinds = [i.get("type") in ("function_call", "reasoning") or i.get("role") == "assistant"
                     for i in body.get("input") or [] if i.get("role") != "developer"]
            return sum(now and not before for before, now in zip([False, *kinds], kinds, strict=False))
        return 0

    def spawned_agents(self) -> list[str]:
        """The ids of the sub-agents Codex's ``spawn_agent`` calls started, from their outputs so far."""
        outputs = [_flatten(i.get("output")) for i in self.data().get("input") or []
                   if i.get("type") == "function_call_output"]
        return [json.loads(o)["agent_id"] for o in outputs if o.startswith("{") and '"agent_id"' in o]

    def user_text(self) -> str:
        """The text of the conversation's user messages (not tool results): a subagent's
        requests carry its task here, the main agent's the user's prompt."""
        body = self.data()
        if self.api == "anthropic":
            blocks = [b for m in body.get("messages") or [] if m.get("role") == "user"
                      for b in (m["content"] if isinstance(m.get("content"), list) else [m.get("content")])]
            return "\n".join(_flatten(b) for b in blocks if not isinstance(b, dict) or b.get("type") != "tool_result")
        if self.api == "openai":
            return "\n".join(_flatten(i.get("content")) for i in body.get("input") or [] if i.get("role") == "user")
        if self.api == "gemini":
            return "\n".join(p["text"] for c in body.get("contents") or [] if c.get("role") == "user"
                             for p in c.get("parts") or [] if "text" in p)
        return ""


def _flatten(content: Any) -> str:
    """The text inside a content value, whatever its nesting (string, blocks, parts, dicts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_flatten(c) for c in content)
    if isinstance(content, dict):
        for key in ("text", "output", "error", "content"):
            if key in content:
                return _flatten(content[key])
        return json.dumps(content, ensure_ascii=False)
    return str(content)


Script = Sequence[Reply] | Callable[[ModelRequest], Reply]


def calls_of(reply: Reply) -> list[Call]:
    if isinstance(reply, str):
        return []
    return [reply] if isinstance(reply, Call) else list(reply)


@dataclass
class ModelServer:
    """The scripted model, served from a thread on 127.0.0.1 (port chosen by the OS).

    ``url`` is the base for ``ANTHROPIC_BASE_URL`` and ``GOOGLE_GEMINI_BASE_URL``; Codex's provider
    ``base_url`` is ``url + "/v1"``."""

    script: Script
    model: str = "scripted-model"
    requests: list[ModelRequest] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1), repr=False)
    _main_count: int = 0
    _httpd: ThreadingHTTPServer | None = field(default=None, repr=False)

    def __enter__(self) -> ModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ModelServer:
        server = self

        class Handler(_Handler):
            model_server = server

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, args=(0.05,), name="model-server", daemon=True).start()
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "the server is not started"
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def main_requests(self) -> list[ModelRequest]:
        with self._lock:
            return [r for r in self.requests if r.main]

    @property
    def errors(self) -> list[str]:
        """Exceptions the script raised (their requests were answered with HTTP 400)."""
        with self._lock:
            return [r.error for r in self.requests if r.error]

    def seen(self, needle: str) -> bool:
        """Whether any main request carried ``needle`` (e.g. a hook's reason the model was shown)."""
        return any(r.seen(needle) for r in self.main_requests)

    def next_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def record(self, request: ModelRequest) -> None:
        with self._lock:
            if request.main:
                request.index = self._main_count
                self._main_count += 1
            self.requests.append(request)

    def answer(self, request: ModelRequest) -> Reply:
        if callable(self.script):
            return self.script(request)
        return self.script[request.index] if request.index < len(self.script) else EXHAUSTED


class _Handler(BaseHTTPRequestHandler):
    """Routes each request to its wire format; whole responses with a length, so keep-alive works."""

    protocol_version = "HTTP/1.1"
    model_server: ModelServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self.handle_any()

    def do_POST(self) -> None:
        self.handle_any()

    def do_HEAD(self) -> None:
        self.handle_any()

    def read_body(self) -> Any:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            raw = b""
            while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                raw += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
        else:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Content-Encoding", "").lower() == "gzip":
            raw = gzip.decompress(raw)
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return raw.decode("utf-8", "replace")

    def handle_any(self) -> None:
        parts = urlsplit(self.path)
        path = parts.path
        api: Api = ("anthropic" if path.startswith("/v1/messages") else "openai" if path.startswith("/v1/responses")
                    else "gemini" if path.startswith("/v1beta/") or path.startswith("/v1/models/") else "other")
        body = self.read_body() if self.command == "POST" else None
        request = ModelRequest(api, self.command, path, parts.query, dict(self.headers.items()), body)
        request.main = self.command == "POST" and _is_main(request)
        server = self.model_server
        server.record(request)
        try:
            reply = server.answer(request) if request.main else _side_reply(request)
            request.reply = reply
            status, content_type, payload = _respond(request, reply, server)
        except Exception:
            request.error = traceback.format_exc()
            status, content_type = 400, "application/json"
            payload = json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                             "message": request.error}}).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)


def _is_main(request: ModelRequest) -> bool:
    """An agent-loop request: it offers tools (side requests such as titles or routing do not)."""
    body = request.data()
    if request.api == "anthropic":
        return request.path == "/v1/messages" and bool(body.get("tools"))
    if request.api == "openai":
        return bool(body.get("tools"))
    if request.api == "gemini":
        return request.path.endswith(":streamGenerateContent") and bool(body.get("tools"))
    return False


def _side_reply(request: ModelRequest) -> Reply:
    """What a side request gets: for Gemini's JSON requests (router, next speaker) a minimal
    valid object, else a short text."""
    schema = _gemini_schema(request.data()) if request.api == "gemini" else None
    return json.dumps(_from_schema(schema)) if schema else "ok"


def _respond(request: ModelRequest, reply: Reply, server: ModelServer) -> tuple[int, str, bytes]:
    body = request.data()
    if request.api == "anthropic":
        if request.path.endswith("/count_tokens"):
            return 200, "application/json", json.dumps({"input_tokens": 100}).encode()
        if body.get("stream"):
            return 200, "text/event-stream", _anthropic_sse(reply, server)
        return 200, "application/json", json.dumps(_anthropic_message(reply, server)).encode()
    if request.api == "openai":
        return 200, "text/event-stream", _openai_sse(reply, server)
    if request.api == "gemini":
        if request.path.endswith(":countTokens"):
            return 200, "application/json", json.dumps({"totalTokens": 100}).encode()
        chunk = _gemini_response(reply, server)
        if request.path.endswith(":streamGenerateContent"):
            return 200, "text/event-stream", f"data: {json.dumps(chunk)}\r\n\r\n".encode()
        return 200, "application/json", json.dumps(chunk).encode()
    return 200, "application/json", b"{}"


def _sse(events: list[dict[str, Any]]) -> bytes:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()


def _anthropic_blocks(reply: Reply, server: ModelServer) -> list[dict[str, Any]]:
    calls = calls_of(reply)
    if not calls:
        return [{"type": "text", "text": reply}]
    return [{"type": "tool_use", "id": f"toolu_{server.next_id():04d}", "name": c.name, "input": c.args}
            for c in calls]


def _anthropic_message(reply: Reply, server: ModelServer) -> dict[str, Any]:
    blocks = _anthropic_blocks(reply, server)
    return {"id": f"msg_{server.next_id():04d}", "type": "message", "role": "assistant", "model": server.model,
            "content": blocks, "stop_reason": "tool_use" if calls_of(reply) else "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 10}}


def _anthropic_sse(reply: Reply, server: ModelServer) -> bytes:
    message = _anthropic_message(reply, server)
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "usage": {"input_tokens": 100, "output_tokens": 1}}}]
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            start, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            partial = json.dumps(block["input"])
            start, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": partial}
        events += [{"type": "content_block_start", "index": index, "content_block": start},
                   {"type": "content_block_delta", "index": index, "delta": delta},
                   {"type": "content_block_stop", "index": index}]
    events += [{"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 10}},
               {"type": "message_stop"}]
    return _sse(events)


def _openai_sse(reply: Reply, server: ModelServer) -> bytes:
    rid = f"resp_{server.next_id():04d}"
    calls = calls_of(reply)
    if calls:
        items = [{"type": "function_call", "id": f"fc_{n:04d}", "call_id": f"call_{n:04d}", "name": c.name,
                  **({"namespace": c.namespace} if c.namespace else {}), "arguments": json.dumps(c.args),
                  "status": "completed"}
                 for c, n in ((c, server.next_id()) for c in calls)]
    else:
        items = [{"type": "message", "id": f"msg_{server.next_id():04d}", "role": "assistant", "status": "completed",
                  "content": [{"type": "output_text", "text": reply, "annotations": []}]}]
    response = {"id": rid, "object": "response", "model": server.model, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [{"type": "response.created", "response": response}]
    for index, item in enumerate(items):
        events += [{"type": "response.output_item.added", "output_index": index, "item": item},
                   {"type": "response.output_item.done", "output_index": index, "item": item}]
    usage = {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 10,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 110}
    events.append({"type": "response.completed",
                   "response": {**response, "status": "completed", "output": items, "usage": usage}})
    return _sse(events)


def _gemini_response(reply: Reply, server: ModelServer) -> dict[str, Any]:
    calls = calls_of(reply)
    parts = [{"functionCall": {"name": c.name, "args": c.args}} for c in calls] if calls else [{"text": reply}]
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": {"promptTokenCount": 100, "candidatesTokenCount": 10, "totalTokenCount": 110},
            "modelVersion": server.model, "responseId": f"r{server.next_id():04d}"}


def _gemini_schema(body: dict[str, Any]) -> dict[str, Any] | None:
    config = body.get("generationConfig") or {}
    return config.get("responseJsonSchema") or config.get("responseSchema")


def _from_schema(schema: dict[str, Any]) -> Any:
    """A minimal value valid for a JSON schema: the first enum choice (the router's "flash", the
    next-speaker check's "user"), "ok", ones (the router's score must be at least 1), required
    properties only."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = str(schema.get("type", "object")).lower()
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: _from_schema(props.get(k, {})) for k in schema.get("required", props)}
    return {"array": [], "string": "ok", "integer": 1, "number": 1, "boolean": False}.get(kind)
