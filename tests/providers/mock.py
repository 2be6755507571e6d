"""A model provider's API, played by its official SDK's own types.

The tests' yardstick for a provider client (tests/src/provider_mock.rs
starts it): every request Bindery sends is validated with the SDK's request
types (pydantic over the SDK's TypedDicts, made strict: a key the SDK does
not know is refused, and every lazily checked list is walked), then with
the rules the provider documents and the types cannot say (ids and names,
tool results answering the calls before them, thinking sent back with its
signature); every answer is built from the SDK's response models, whole or
as the event stream the provider documents.

    mock.py --provider anthropic --key KEY --script SCRIPT.json --log LOG.jsonl

SCRIPT.json is the list of answers, one per request, in order:
  {"status": 429, "retry_after": "1"}         an error (Anthropic's shape)
  {"thinking": "...", "text": "...",          a reply: each part optional;
   "calls": [{"id", "name", "input"}],        calls are tool_use blocks
   "usage": {"input", "output", "cache_read", "cache_write"}}
Each request is appended to LOG.jsonl as {"path", "stream", "key_ok",
"version", "body", "violations"}; a request with violations is answered 400
(and the test reading the log fails on it). The port is printed as
`PORT <n>`; the server stops when its stdin closes.
"""

import argparse
import base64
import hashlib
import hmac
import json
import re
import sys
import threading
import typing_extensions
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import BaseModel, ConfigDict, TypeAdapter

import anthropic
import anthropic.types as T
from anthropic.types import message_create_params


def strict_sdk_types(prefix):
    """Every TypedDict and model of the SDK's `types` refuses unknown keys."""
    models = set()
    for name, module in list(sys.modules.items()):
        if not name.startswith(prefix):
            continue
        for v in vars(module).values():
            if isinstance(v, type) and typing_extensions.is_typeddict(v):
                v.__pydantic_config__ = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
            elif isinstance(v, type) and issubclass(v, BaseModel) and v.__module__.startswith(prefix):
                models.add(v)
    for m in models:
        m.model_config = {**m.model_config, "extra": "forbid"}
    for m in models:
        m.model_rebuild(force=True)


def drain(x):
    """pydantic checks an `Iterable[...]` lazily, item by item: walk it all."""
    if isinstance(x, dict):
        return {k: drain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [drain(v) for v in x]
    if type(x).__name__ == "ValidatorIterator":
        return [drain(v) for v in x]
    return x


strict_sdk_types("anthropic.types")
REQUEST = {
    False: TypeAdapter(message_create_params.MessageCreateParamsNonStreaming),
    True: TypeAdapter(message_create_params.MessageCreateParamsStreaming),
}
ID = re.compile(r"^[a-zA-Z0-9_-]+$")
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")
SIGNING_KEY = b"mock-provider"


def sign(thinking):
    return base64.b64encode(hmac.new(SIGNING_KEY, thinking.encode(), hashlib.sha256).digest()).decode()


def blocks(message):
    content = message.get("content")
    return content if isinstance(content, list) else [{"type": "text", "text": content}]


def documented_rules(body):
    """What Anthropic's docs require beyond the types, as messages."""
    out = []
    messages = body.get("messages", [])
    cache_points = 0
    for tool in body.get("tools", []):
        if not TOOL_NAME.match(tool.get("name", "")):
            out.append(f"tool name {tool.get('name')!r} does not match {TOOL_NAME.pattern}")
        if tool.get("input_schema", {}).get("type") != "object":
            out.append(f"tool {tool.get('name')!r}: input_schema.type must be object")
        cache_points += "cache_control" in tool
    system = body.get("system")
    if isinstance(system, list):
        cache_points += sum("cache_control" in b for b in system)
    thinking = body.get("thinking") or {}
    if thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens", 0)
        if budget < 1024 or budget >= body.get("max_tokens", 0):
            out.append(f"thinking.budget_tokens {budget} must be >= 1024 and < max_tokens")
    if messages and messages[0].get("role") != "user":
        out.append("the first message must be the user's")
    for i, m in enumerate(messages):
        if i and m.get("role") == messages[i - 1].get("role"):
            out.append(f"messages {i - 1} and {i} are both {m.get('role')}")
        bs = blocks(m)
        cache_points += sum(isinstance(b, dict) and "cache_control" in b for b in bs)
        for b in bs:
            if b.get("type") == "tool_use":
                if not ID.match(b.get("id", "")):
                    out.append(f"message {i}: tool_use id {b.get('id')!r} does not match {ID.pattern}")
            if b.get("type") == "thinking" and b.get("signature") != sign(b.get("thinking", "")):
                out.append(f"message {i}: a thinking block's signature does not match its text")
        if m.get("role") == "assistant":
            uses = [b["id"] for b in bs if b.get("type") == "tool_use"]
            if uses and thinking.get("type") == "enabled" and i == len(messages) - 2:
                if bs[0].get("type") not in ("thinking", "redacted_thinking"):
                    out.append(
                        f"message {i}: with thinking on, an assistant turn with tool_use must begin with its "
                        f"thinking block, found {bs[0].get('type')!r}"
                    )
            if uses:
                following = blocks(messages[i + 1]) if i + 1 < len(messages) else []
                results = []
                for b in following:
                    if b.get("type") != "tool_result":
                        break
                    results.append(b.get("tool_use_id"))
                if i + 1 < len(messages) and sorted(results) != sorted(uses):
                    out.append(
                        f"message {i + 1}: tool_result blocks {results} (first in the turn) must answer "
                        f"the tool_use ids {uses} of message {i}"
                    )
        if m.get("role") == "user" and i:
            previous = [b.get("id") for b in blocks(messages[i - 1]) if b.get("type") == "tool_use"]
            for b in bs:
                if b.get("type") == "tool_result" and b.get("tool_use_id") not in previous:
                    out.append(f"message {i}: tool_result for {b.get('tool_use_id')!r}, not a call of message {i - 1}")
    if cache_points > 4:
        out.append(f"{cache_points} cache_control breakpoints, more than 4")
    return out


def usage_of(spec):
    u = spec.get("usage", {})
    return T.Usage(
        input_tokens=u.get("input", 10),
        output_tokens=u.get("output", 5),
        cache_read_input_tokens=u.get("cache_read", 0),
        cache_creation_input_tokens=u.get("cache_write", 0),
    )


def content_of(spec):
    content = []
    if "thinking" in spec:
        content.append(T.ThinkingBlock(type="thinking", thinking=spec["thinking"], signature=sign(spec["thinking"])))
    if "text" in spec:
        content.append(T.TextBlock(type="text", text=spec["text"], citations=None))
    for c in spec.get("calls", []):
        content.append(T.ToolUseBlock(type="tool_use", id=c["id"], name=c["name"], input=c.get("input", {})))
    return content


def stop_of(spec):
    return "tool_use" if spec.get("calls") else "end_turn"


def message_of(spec, model):
    return T.Message(
        id="msg_mock",
        type="message",
        role="assistant",
        model=model,
        content=content_of(spec),
        stop_reason=stop_of(spec),
        stop_sequence=None,
        usage=usage_of(spec),
    )


def events_of(spec, model):
    """The stream of one reply, in the order Anthropic documents."""
    start = message_of(spec, model).model_copy(update={"content": [], "stop_reason": None})
    u = usage_of(spec)
    start.usage = u.model_copy(update={"output_tokens": 1})
    yield T.RawMessageStartEvent(type="message_start", message=start)
    yield PING
    for i, block in enumerate(content_of(spec)):
        if block.type == "thinking":
            empty = T.ThinkingBlock(type="thinking", thinking="", signature="")
            yield T.RawContentBlockStartEvent(type="content_block_start", index=i, content_block=empty)
            half = len(block.thinking) // 2
            for piece in (block.thinking[:half], block.thinking[half:]):
                delta = T.ThinkingDelta(type="thinking_delta", thinking=piece)
                yield T.RawContentBlockDeltaEvent(type="content_block_delta", index=i, delta=delta)
            delta = T.SignatureDelta(type="signature_delta", signature=block.signature)
            yield T.RawContentBlockDeltaEvent(type="content_block_delta", index=i, delta=delta)
        elif block.type == "text":
            empty = T.TextBlock(type="text", text="", citations=None)
            yield T.RawContentBlockStartEvent(type="content_block_start", index=i, content_block=empty)
            half = len(block.text) // 2
            for piece in (block.text[:half], block.text[half:]):
                delta = T.TextDelta(type="text_delta", text=piece)
                yield T.RawContentBlockDeltaEvent(type="content_block_delta", index=i, delta=delta)
        else:
            empty = block.model_copy(update={"input": {}})
            yield T.RawContentBlockStartEvent(type="content_block_start", index=i, content_block=empty)
            text = json.dumps(block.input)
            half = len(text) // 2
            for piece in (text[:half], text[half:]):
                delta = T.InputJSONDelta(type="input_json_delta", partial_json=piece)
                yield T.RawContentBlockDeltaEvent(type="content_block_delta", index=i, delta=delta)
        yield T.RawContentBlockStopEvent(type="content_block_stop", index=i)
    delta = T.RawMessageDeltaEvent(
        type="message_delta",
        delta={"stop_reason": stop_of(spec), "stop_sequence": None},
        usage=T.MessageDeltaUsage(output_tokens=u.output_tokens),
    )
    yield delta
    yield T.RawMessageStopEvent(type="message_stop")


class Ping:
    """The keep-alive Anthropic sends between events (no SDK model)."""
    type = "ping"

    def model_dump_json(self):
        return '{"type": "ping"}'


PING = Ping()


def error_body(kind, message):
    objects = {
        "rate_limit_error": T.RateLimitError,
        "invalid_request_error": T.InvalidRequestError,
        "overloaded_error": T.OverloadedError,
        "authentication_error": T.AuthenticationError,
    }
    error = objects[kind](type=kind, message=message)
    return T.ErrorResponse(type="error", error=error, request_id=None).model_dump_json()


class Mock:
    def __init__(self, args):
        self.key = args.key
        self.script = json.load(open(args.script))
        self.log = open(args.log, "a")
        self.lock = threading.Lock()
        self.next = 0


def handler(mock):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send(self, status, body, headers=()):
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            violations = []
            try:
                body = json.loads(raw)
            except ValueError as e:
                body, violations = None, [f"the body is not JSON: {e}"]
            stream = bool(body and body.get("stream"))
            if not self.path.endswith("/v1/messages"):
                violations.append(f"POST {self.path}, not /v1/messages")
            if self.headers.get("anthropic-version") != "2023-06-01":
                violations.append(f"anthropic-version {self.headers.get('anthropic-version')!r}")
            if self.headers.get("authorization") is not None:
                violations.append("an Authorization header: Anthropic's key goes in x-api-key")
            key_ok = self.headers.get("x-api-key") == mock.key
            if body is not None:
                try:
                    drain(REQUEST[stream].validate_python(body))
                except Exception as e:
                    violations.append(f"the SDK's request type refuses it: {e}")
                violations.extend(documented_rules(body))
            with mock.lock:
                record = {"path": self.path, "stream": stream, "key_ok": key_ok,
                          "version": self.headers.get("anthropic-version"), "body": body,
                          "violations": violations}
                mock.log.write(json.dumps(record) + "\n")
                mock.log.flush()
                if violations:
                    step = None
                else:
                    step = mock.script[mock.next] if mock.next < len(mock.script) else {"text": "(script ended)"}
                    mock.next += 1
            if violations:
                return self.send(400, error_body("invalid_request_error", "; ".join(violations)))
            if not key_ok:
                return self.send(401, error_body("authentication_error", "invalid x-api-key"))
            if "status" in step:
                kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(step["status"], "invalid_request_error")
                headers = [("retry-after", step["retry_after"])] if "retry_after" in step else []
                return self.send(step["status"], error_body(kind, "scripted"), headers)
            model = body["model"]
            if not stream:
                return self.send(200, message_of(step, model).model_dump_json())
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for event in events_of(step, model):
                self.wfile.write(f"event: {event.type}\ndata: {event.model_dump_json()}\n\n".encode())
                self.wfile.flush()
            self.close_connection = True

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--provider", choices=["anthropic"], required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--script", required=True)
    p.add_argument("--log", required=True)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(Mock(args)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"PORT {server.server_address[1]}", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
