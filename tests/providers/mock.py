"""A model provider's API, played by its official SDK's own types.

The tests' yardstick for a provider client (tests/src/provider_mock.rs
starts it): every request Bindery sends is validated with the SDK's request
types (pydantic over the SDK's TypedDicts, made strict: a key the SDK does
not know is refused, and every lazily checked list is walked), then with
the rules the provider documents and the types cannot say (ids and names,
tool results answering the calls before them, thinking sent back with its
signature); every answer is built from the SDK's response models, whole or
as the event stream the provider documents.

    mock.py --provider anthropic|openai|gemini|bedrock|responses|azure \
        --key KEY --script SCRIPT.json --log LOG.jsonl

(the last four live in modules of their own beside this one: `PLUGINS`).

SCRIPT.json is the list of answers, one per request, in order:
  {"status": 429, "retry_after": "1"}         an error (the provider's shape)
  {"thinking": "...", "text": "...",          a reply: each part optional;
   "calls": [{"id", "name", "input"}],        calls are tool_use blocks or
   "usage": {"input", "output",               tool_calls; thinking is
             "cache_read", "cache_write"}}    Anthropic's only
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
import os
import re
import sys
import threading
import typing_extensions
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from pydantic import BaseModel, ConfigDict, TypeAdapter

import anthropic
import anthropic.types as T
import openai
import openai.types as O
import openai.types.chat as OC
from anthropic.types import message_create_params
from openai.types.chat import completion_create_params
from openai.types.chat import chat_completion, chat_completion_chunk


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
strict_sdk_types("openai.types")
REQUEST = {
    False: TypeAdapter(message_create_params.MessageCreateParamsNonStreaming),
    True: TypeAdapter(message_create_params.MessageCreateParamsStreaming),
}
OPENAI_REQUEST = {
    False: TypeAdapter(completion_create_params.CompletionCreateParamsNonStreaming),
    True: TypeAdapter(completion_create_params.CompletionCreateParamsStreaming),
}
OPENAI_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
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


def openai_rules(body):
    """What OpenAI's docs and API require beyond the types."""
    out = []
    for tool in body.get("tools", []):
        name = tool.get("function", {}).get("name", "")
        if not OPENAI_TOOL_NAME.match(name):
            out.append(f"tool name {name!r} does not match {OPENAI_TOOL_NAME.pattern}")
    messages = body.get("messages", [])
    for i, m in enumerate(messages):
        calls = [c.get("id", "") for c in m.get("tool_calls") or []] if m.get("role") == "assistant" else []
        for c in m.get("tool_calls") or []:
            if len(c.get("id", "")) > 40:
                out.append(f"message {i}: tool call id {c.get('id')!r} is longer than 40")
            try:
                json.loads(c.get("function", {}).get("arguments", ""))
            except ValueError:
                out.append(f"message {i}: a tool call's arguments are not JSON text")
        if calls:
            answered = []
            for following in messages[i + 1:]:
                if following.get("role") != "tool":
                    break
                answered.append(following.get("tool_call_id"))
            if sorted(answered) != sorted(calls):
                out.append(f"messages after {i}: tool messages {answered} must answer the tool_calls {calls} first")
        if m.get("role") == "tool":
            j = i - 1
            while j >= 0 and messages[j].get("role") == "tool":
                j -= 1
            previous = [c.get("id") for c in (messages[j].get("tool_calls") or [])] if j >= 0 else []
            if m.get("tool_call_id") not in previous:
                out.append(f"message {i}: a tool message for {m.get('tool_call_id')!r}, no call of message {j}")
    if body.get("stream") and not (body.get("stream_options") or {}).get("include_usage"):
        out.append("a streamed request without stream_options.include_usage gets no usage")
    return out


def openai_usage(spec):
    u = spec.get("usage", {})
    prompt = u.get("input", 10) + u.get("cache_read", 0)
    return O.CompletionUsage(
        prompt_tokens=prompt,
        completion_tokens=u.get("output", 5),
        total_tokens=prompt + u.get("output", 5),
        prompt_tokens_details=O.completion_usage.PromptTokensDetails(cached_tokens=u.get("cache_read", 0)),
    )


def openai_calls(spec):
    return [
        OC.ChatCompletionMessageFunctionToolCall(
            id=c["id"], type="function",
            function={"name": c["name"], "arguments": json.dumps(c.get("input", {}))},
        )
        for c in spec.get("calls", [])
    ]


def completion_of(spec, model):
    message = OC.ChatCompletionMessage(
        role="assistant", content=spec.get("text"), tool_calls=openai_calls(spec) or None, refusal=None,
    )
    choice = chat_completion.Choice(
        index=0, message=message, logprobs=None,
        finish_reason="tool_calls" if spec.get("calls") else "stop",
    )
    return OC.ChatCompletion(
        id="chatcmpl-mock", object="chat.completion", created=0, model=model,
        choices=[choice], usage=openai_usage(spec),
    )


def chunks_of(spec, model):
    """A streamed completion as OpenAI sends it: the role, the text in
    pieces, each call's id and name then its arguments in pieces, the
    finish, the usage alone, then [DONE]."""
    def chunk(delta=None, finish=None, usage=None, choices=True):
        ch = []
        if choices:
            ch = [chat_completion_chunk.Choice(
                index=0, delta=delta or chat_completion_chunk.ChoiceDelta(), finish_reason=finish, logprobs=None)]
        return OC.ChatCompletionChunk(
            id="chatcmpl-mock", object="chat.completion.chunk", created=0, model=model,
            choices=ch, usage=usage,
        )
    D = chat_completion_chunk.ChoiceDelta
    yield chunk(D(role="assistant", content=""))
    text = spec.get("text") or ""
    if text:
        half = len(text) // 2
        for piece in (text[:half], text[half:]):
            yield chunk(D(content=piece))
    for i, c in enumerate(spec.get("calls", [])):
        F = chat_completion_chunk.ChoiceDeltaToolCallFunction
        TC = chat_completion_chunk.ChoiceDeltaToolCall
        yield chunk(D(tool_calls=[TC(index=i, id=c["id"], type="function", function=F(name=c["name"], arguments=""))]))
        args = json.dumps(c.get("input", {}))
        half = len(args) // 2
        for piece in (args[:half], args[half:]):
            yield chunk(D(tool_calls=[TC(index=i, function=F(arguments=piece))]))
    yield chunk(D(), finish="tool_calls" if spec.get("calls") else "stop")
    yield chunk(choices=False, usage=openai_usage(spec))


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


def error_body(kind, message, provider="anthropic"):
    if provider == "openai":
        error = O.shared.ErrorObject(message=message, type=kind, param=None, code=None)
        return json.dumps({"error": error.model_dump(mode="json")})
    objects = {
        "rate_limit_error": T.RateLimitError,
        "invalid_request_error": T.InvalidRequestError,
        "overloaded_error": T.OverloadedError,
        "authentication_error": T.AuthenticationError,
    }
    error = objects[kind](type=kind, message=message)
    return T.ErrorResponse(type="error", error=error, request_id=None).model_dump_json()


# Providers in a module of their own (tests/providers/<name>.py), each with
#   request(handler, raw, key, violations) -> (body, stream, key_ok, model)
#       checks one request (path, headers, the raw body) with the SDK's types
#       and the provider's rules, appending what is wrong to `violations`;
#   reply(handler, step, model, stream)  answers with a script step;
#   error(handler, status, message, retry_after)  answers an error in the
#       provider's own shape.
PLUGINS = ["gemini", "bedrock", "responses", "azure"]


class Mock:
    def __init__(self, args):
        self.provider = args.provider
        self.plugin = None
        if args.provider in PLUGINS:
            import importlib
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            self.plugin = importlib.import_module(args.provider)
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
            if mock.plugin is not None:
                return self.plugin_post(raw)
            violations = []
            try:
                body = json.loads(raw)
            except ValueError as e:
                body, violations = None, [f"the body is not JSON: {e}"]
            stream = bool(body and body.get("stream"))
            if mock.provider == "anthropic":
                key_ok = self.anthropic_request(body, stream, violations)
            else:
                key_ok = self.openai_request(body, stream, violations)
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
                return self.send(400, error_body("invalid_request_error", "; ".join(violations), mock.provider))
            if not key_ok:
                return self.send(401, error_body("authentication_error", "invalid key", mock.provider))
            if "status" in step:
                kind = {429: "rate_limit_error", 529: "overloaded_error"}.get(step["status"], "invalid_request_error")
                headers = [("retry-after", step["retry_after"])] if "retry_after" in step else []
                return self.send(step["status"], error_body(kind, "scripted", mock.provider), headers)
            model = body["model"]
            if mock.provider == "openai":
                return self.openai_reply(step, model, stream)
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

        def plugin_post(self, raw):
            """A provider of its own module (see `PLUGINS`)."""
            plugin = mock.plugin
            violations = []
            body, stream, key_ok, model = plugin.request(self, raw, mock.key, violations)
            with mock.lock:
                record = {"path": self.path, "stream": stream, "key_ok": key_ok, "version": None,
                          "body": body, "violations": violations}
                mock.log.write(json.dumps(record) + "\n")
                mock.log.flush()
                step = None
                if not violations:
                    step = mock.script[mock.next] if mock.next < len(mock.script) else {"text": "(script ended)"}
                    mock.next += 1
            if violations:
                return plugin.error(self, 400, "; ".join(violations), None)
            if not key_ok:
                return plugin.error(self, 403, "the credentials are not the expected ones", None)
            if "status" in step:
                return plugin.error(self, step["status"], "scripted", step.get("retry_after"))
            return plugin.reply(self, step, model, stream)

        def anthropic_request(self, body, stream, violations):
            if not self.path.endswith("/v1/messages"):
                violations.append(f"POST {self.path}, not /v1/messages")
            if self.headers.get("anthropic-version") != "2023-06-01":
                violations.append(f"anthropic-version {self.headers.get('anthropic-version')!r}")
            if self.headers.get("authorization") is not None:
                violations.append("an Authorization header: Anthropic's key goes in x-api-key")
            if body is not None:
                try:
                    drain(REQUEST[stream].validate_python(body))
                except Exception as e:
                    violations.append(f"the SDK's request type refuses it: {e}")
                violations.extend(documented_rules(body))
            return self.headers.get("x-api-key") == mock.key

        def openai_request(self, body, stream, violations):
            if not self.path.endswith("/v1/chat/completions"):
                violations.append(f"POST {self.path}, not /v1/chat/completions")
            if self.headers.get("x-api-key") is not None:
                violations.append("an x-api-key header: OpenAI's key goes in Authorization")
            if body is not None:
                try:
                    drain(OPENAI_REQUEST[stream].validate_python(body))
                except Exception as e:
                    violations.append(f"the SDK's request type refuses it: {e}")
                violations.extend(openai_rules(body))
            return self.headers.get("authorization") == f"Bearer {mock.key}"

        def openai_reply(self, step, model, stream):
            if not stream:
                return self.send(200, completion_of(step, model).model_dump_json())
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            self.end_headers()
            for chunk in chunks_of(step, model):
                self.wfile.write(f"data: {chunk.model_dump_json()}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--provider", choices=["anthropic", "openai"] + PLUGINS, required=True)
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
