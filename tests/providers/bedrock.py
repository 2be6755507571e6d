"""Amazon Bedrock's Converse API, played by botocore's own service model.

A plugin of mock.py (see `PLUGINS` there): `--provider bedrock`, the key
`ACCESS_KEY_ID:SECRET_ACCESS_KEY:REGION` (optionally `:SESSION_TOKEN`).

Every request is checked as the service would check it:
- its path, `/model/{modelId}/converse` or `/model/{modelId}/converse-stream`,
  the model id one segment encoded as botocore encodes it;
- its SigV4 signature, recomputed with botocore's own signer
  (`botocore.auth.SigV4Auth`, service `bedrock`) over the request as
  received, with its X-Amz-Date and the headers it says it signed (the
  session token in X-Amz-Security-Token when the key has one) -> key_ok;
- its body, with botocore's `ParamValidator` against the bedrock-runtime
  model's ConverseRequest / ConverseStreamRequest (strict: a member the
  model does not know is refused, a union takes one member), then the
  constraints the validator leaves (max lengths, patterns, enums), then the
  rules the model cannot say: alternating turns beginning with the user's,
  toolResults answering the toolUses of the turn before (first in their
  turn), toolConfig given with tool blocks, reasoning sent back with its
  signature (`sign` of mock.py), no blank text, at most 4 cachePoints, a
  thinking budget below maxTokens.

Answers: a whole reply is the JSON of ConverseResponse (validated against
that output shape before it is sent); a stream is the event-stream frames
of ConverseStreamOutput's events in the documented order (each event's
payload validated against its shape, then padded with the `p` member the
service adds), `content-type: application/vnd.amazon.eventstream`. Errors
are AWS's JSON shape, `{"message": ...}`, with `x-amzn-ErrorType`.

Beside mock.py's script steps, a streamed step may be
  {"exception": "throttlingException", "message": "..."}
which streams `messageStart` then that exception (a whole request gets it
as the HTTP error it stands for).
"""

import base64
import binascii
import datetime
import hashlib
import hmac
import json
import re
import struct
import zlib
from urllib.parse import unquote, urlsplit

import botocore.auth
import botocore.credentials
import botocore.session
from botocore.awsrequest import AWSRequest
from botocore.utils import percent_encode
from botocore.validate import ParamValidator

SERVICE = botocore.session.get_session().get_service_model("bedrock-runtime")
REQUEST = {
    False: SERVICE.operation_model("Converse").input_shape,
    True: SERVICE.operation_model("ConverseStream").input_shape,
}
RESPONSE = SERVICE.operation_model("Converse").output_shape
EVENTS = SERVICE.operation_model("ConverseStream").output_shape.members["stream"]
PATH = re.compile(r"^/model/([^/?]+)/(converse|converse-stream)$")
# The service's ToolUseId allows `.` and `:` too; the Claude models behind
# it do not (Anthropic's `^[a-zA-Z0-9_-]+$`).
TOOL_USE_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
DOCUMENT_NAME = re.compile(r"^(?!.*\s\s)[a-zA-Z0-9\s\-()\[\]]{1,200}$")
ERROR_TYPES = {
    400: "ValidationException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    500: "InternalServerException",
    503: "ServiceUnavailableException",
}
STATUS_OF_EXCEPTION = {
    "throttlingException": 429,
    "serviceUnavailableException": 503,
    "internalServerException": 500,
    "modelStreamErrorException": 424,
    "validationException": 400,
}
SIGNING_KEY = b"mock-provider"


def sign(text):
    """A reasoning block's signature, as mock.py's `sign` makes Anthropic's."""
    return base64.b64encode(hmac.new(SIGNING_KEY, text.encode(), hashlib.sha256).digest()).decode()


# Requests.

def request(handler, raw, key, violations):
    """Checks one request; (body, stream, key_ok, model)."""
    path = handler.path
    match = PATH.match(path)
    stream, model = False, None
    if not match:
        violations.append(f"POST {path}, not /model/{{modelId}}/converse or /converse-stream")
    else:
        segment, action = match.groups()
        stream = action == "converse-stream"
        model = unquote(segment)
        if percent_encode(model) != segment:
            violations.append(
                f"the model id segment {segment!r} is not encoded as botocore encodes it "
                f"({percent_encode(model)!r})"
            )
    if not (handler.headers.get("content-type") or "").startswith("application/json"):
        violations.append(f"content-type {handler.headers.get('content-type')!r}, not application/json")
    key_ok = signature_ok(handler, raw, key, violations)
    try:
        body = json.loads(raw)
    except ValueError as e:
        violations.append(f"the body is not JSON: {e}")
        return None, stream, key_ok, model
    if not isinstance(body, dict):
        violations.append("the body is not an object")
        return body, stream, key_ok, model
    if "modelId" in body:
        violations.append("modelId is in the body: it goes in the path")
    params = dict(body, modelId=model or "")
    report = ParamValidator().validate(params, REQUEST[stream])
    if report.has_errors():
        violations.append(f"botocore's {REQUEST[stream].name} refuses it: {report.generate_report()}")
    constraints(params, REQUEST[stream], "", violations)
    violations.extend(documented_rules(body))
    return body, stream, key_ok, model


def parse_key(key):
    parts = key.split(":")
    if len(parts) not in (3, 4):
        raise SystemExit("--key for bedrock is ACCESS_KEY_ID:SECRET_ACCESS_KEY:REGION[:SESSION_TOKEN]")
    access, secret, region = parts[:3]
    return access, secret, region, (parts[3] if len(parts) == 4 else None)


def signature_ok(handler, raw, key, violations):
    """Recomputes the request's SigV4 signature with botocore's signer."""
    access, secret, region, token = parse_key(key)
    auth = handler.headers.get("authorization") or ""
    m = re.fullmatch(
        r"AWS4-HMAC-SHA256 Credential=([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request, "
        r"SignedHeaders=([a-z0-9;-]+), Signature=([0-9a-f]{64})",
        auth,
    )
    if not m:
        violations.append("no SigV4 Authorization header (AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...)")
        return False
    key_id, day, scope_region, service, signed, signature = m.groups()
    amz_date = handler.headers.get("x-amz-date") or ""
    if not re.fullmatch(r"\d{8}T\d{6}Z", amz_date) or amz_date[:8] != day:
        violations.append(f"X-Amz-Date {amz_date!r} is not the credential scope's day {day}")
        return False
    try:
        when = datetime.datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=datetime.timezone.utc)
        if abs((datetime.datetime.now(datetime.timezone.utc) - when).total_seconds()) > 300:
            violations.append(f"X-Amz-Date {amz_date} is more than 5 minutes off")
    except ValueError:
        violations.append(f"X-Amz-Date {amz_date!r} is not a time")
    if service != "bedrock":
        violations.append(f"signed for the service {service!r}, not bedrock")
    names = signed.split(";")
    for needed in ("host", "x-amz-date") + (("x-amz-security-token",) if token else ()):
        if needed not in names:
            violations.append(f"the header {needed} is not signed (SignedHeaders={signed})")
    if token and handler.headers.get("x-amz-security-token") != token:
        violations.append("X-Amz-Security-Token is not the session token")
    if not token and handler.headers.get("x-amz-security-token") is not None:
        violations.append("an X-Amz-Security-Token without a session token")
    sha = handler.headers.get("x-amz-content-sha256")
    if sha is not None and sha != hashlib.sha256(raw).hexdigest():
        violations.append("X-Amz-Content-SHA256 is not the body's")
    headers = {}
    for name in names:
        value = handler.headers.get(name)
        if value is None:
            violations.append(f"the signed header {name} is not in the request")
            return False
        headers[name] = value
    request = AWSRequest(method=handler.command, url=f"http://{headers.get('host', 'x')}{handler.path}",
                         headers=headers, data=raw)
    request.context["timestamp"] = amz_date
    signer = botocore.auth.SigV4Auth(botocore.credentials.Credentials(access, secret, token), "bedrock", region)
    canonical = signer.canonical_request(request)
    expected = signer.signature(signer.string_to_sign(request, canonical), request)
    return key_id == access and scope_region == region and signature == expected


def constraints(value, shape, where, out):
    """What ParamValidator leaves to the service: max lengths, patterns and
    enums of strings, list lengths, numbers' maxima; base64 blobs."""
    meta = shape.metadata
    kind = shape.type_name
    if kind == "structure" and not getattr(shape, "is_document_type", False):
        if isinstance(value, dict):
            for k, v in value.items():
                if k in shape.members:
                    constraints(v, shape.members[k], f"{where}.{k}", out)
    elif kind == "list" and isinstance(value, list):
        if "max" in meta and len(value) > meta["max"]:
            out.append(f"{where}: {len(value)} items, more than {meta['max']}")
        for i, v in enumerate(value):
            constraints(v, shape.member, f"{where}[{i}]", out)
    elif kind == "map" and isinstance(value, dict):
        for k, v in value.items():
            constraints(v, shape.value, f"{where}.{k}", out)
    elif kind == "string" and isinstance(value, str):
        if "max" in meta and len(value) > meta["max"]:
            out.append(f"{where}: {len(value)} characters, more than {meta['max']}")
        if "pattern" in meta and not re.fullmatch(meta["pattern"], value):
            out.append(f"{where}: {value[:80]!r} does not match {meta['pattern']}")
        if shape.enum and value not in shape.enum:
            out.append(f"{where}: {value!r} is not one of {shape.enum}")
    elif kind in ("integer", "long") and isinstance(value, int):
        if "max" in meta and value > meta["max"]:
            out.append(f"{where}: {value} is more than {meta['max']}")
    elif kind == "blob" and isinstance(value, str):
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            out.append(f"{where}: not base64")


def only(block):
    """A union's one member, (name, value)."""
    return next(iter(block.items())) if isinstance(block, dict) and len(block) == 1 else (None, None)


def documented_rules(body):
    """What Bedrock's docs and Claude's require beyond the model."""
    out = []
    messages = body.get("messages") or []
    tools = (body.get("toolConfig") or {}).get("tools") or []
    cache_points = 0
    names = set()
    for tool in tools:
        kind, t = only(tool)
        cache_points += kind == "cachePoint"
        if kind == "toolSpec":
            if t.get("name") in names:
                out.append(f"tool {t.get('name')!r} offered twice")
            names.add(t.get("name"))
            if ((t.get("inputSchema") or {}).get("json") or {}).get("type") != "object":
                out.append(f"tool {t.get('name')!r}: inputSchema.json.type must be object")
    for block in body.get("system") or []:
        kind, v = only(block)
        cache_points += kind == "cachePoint"
        if kind == "text" and not v.strip():
            out.append("a blank system text")
    thinking = (body.get("additionalModelRequestFields") or {}).get("thinking") or {}
    if thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens", 0)
        max_tokens = (body.get("inferenceConfig") or {}).get("maxTokens", 0)
        if not isinstance(budget, int) or budget < 1024 or budget >= max_tokens:
            out.append(f"thinking.budget_tokens {budget} must be >= 1024 and < inferenceConfig.maxTokens {max_tokens}")
    if not messages:
        out.append("no messages")
    elif messages[0].get("role") != "user":
        out.append("the first message must be the user's")
    uses_tools = False
    for i, m in enumerate(messages):
        role, content = m.get("role"), m.get("content") or []
        if role not in ("user", "assistant"):
            out.append(f"message {i}: the role {role!r} (user or assistant)")
        if i and role == messages[i - 1].get("role"):
            out.append(f"messages {i - 1} and {i} are both {role}")
        if not content:
            out.append(f"message {i} has no content")
        kinds = [only(b)[0] for b in content]
        if kinds and kinds[0] == "cachePoint":
            out.append(f"message {i} begins with a cachePoint")
        for j, b in enumerate(content):
            kind, v = only(b)
            where = f"message {i} block {j}"
            cache_points += kind == "cachePoint"
            if kind == "text" and not v.strip():
                out.append(f"{where}: a blank text")
            if kind in ("toolUse", "toolResult"):
                uses_tools = True
                if not TOOL_USE_ID.match(v.get("toolUseId", "")):
                    out.append(f"{where}: toolUseId {v.get('toolUseId')!r} does not match {TOOL_USE_ID.pattern}")
            if kind == "toolUse" and role != "assistant":
                out.append(f"{where}: a toolUse in a {role} turn")
            if kind == "toolResult" and role != "user":
                out.append(f"{where}: a toolResult in a {role} turn")
            if kind == "toolResult":
                for r in v.get("content") or []:
                    rk, rv = only(r)
                    if rk == "text" and not rv.strip():
                        out.append(f"{where}: a blank text in a toolResult")
            if kind == "reasoningContent":
                if role != "assistant":
                    out.append(f"{where}: reasoning in a {role} turn")
                rk, rv = only(v)
                if rk == "reasoningText" and rv.get("signature") != sign(rv.get("text", "")):
                    out.append(f"{where}: a reasoning block's signature does not match its text")
                if kinds[:j] and any(k != "reasoningContent" for k in kinds[:j]):
                    out.append(f"{where}: reasoning after other blocks (it goes first in its turn)")
            if kind == "document" and not DOCUMENT_NAME.match(v.get("name", "")):
                out.append(f"{where}: the document name {v.get('name')!r} (letters, digits, single spaces, -()[])")
        if role == "assistant":
            uses = [only(b)[1].get("toolUseId") for b in content if only(b)[0] == "toolUse"]
            if uses and thinking.get("type") == "enabled" and i == len(messages) - 2 and kinds[0] != "reasoningContent":
                out.append(
                    f"message {i}: with thinking on, an assistant turn with toolUse must begin with its "
                    f"reasoning, found {kinds[0]!r}"
                )
            if uses and i + 1 < len(messages):
                results = []
                for b in messages[i + 1].get("content") or []:
                    kind, v = only(b)
                    if kind != "toolResult":
                        break
                    results.append(v.get("toolUseId"))
                if sorted(map(str, results)) != sorted(map(str, uses)):
                    out.append(
                        f"message {i + 1}: toolResult blocks {results} (first in the turn) must answer "
                        f"the toolUse ids {uses} of message {i}"
                    )
            if len(uses) != len(set(uses)):
                out.append(f"message {i}: two toolUse blocks share an id")
        if role == "user":
            previous = []
            if i:
                previous = [only(b)[1].get("toolUseId") for b in messages[i - 1].get("content") or []
                            if only(b)[0] == "toolUse"]
            for b in content:
                kind, v = only(b)
                if kind == "toolResult" and v.get("toolUseId") not in previous:
                    out.append(f"message {i}: toolResult for {v.get('toolUseId')!r}, not a toolUse of message {i - 1}")
    if uses_tools and not tools:
        out.append("toolConfig must be defined when using toolUse and toolResult content blocks")
    if cache_points > 4:
        out.append(f"{cache_points} cachePoints, more than 4")
    return out


# Answers.

def usage_of(step):
    u = step.get("usage", {})
    read, write = u.get("cache_read", 0), u.get("cache_write", 0)
    inp, outp = u.get("input", 10), u.get("output", 5)
    usage = {"inputTokens": inp, "outputTokens": outp, "totalTokens": inp + outp + read + write}
    if read:
        usage["cacheReadInputTokens"] = read
    if write:
        usage["cacheWriteInputTokens"] = write
    return usage


def content_of(step):
    content = []
    if "thinking" in step:
        content.append({"reasoningContent": {"reasoningText": {"text": step["thinking"], "signature": sign(step["thinking"])}}})
    if "text" in step:
        content.append({"text": step["text"]})
    for c in step.get("calls", []):
        content.append({"toolUse": {"toolUseId": c["id"], "name": c["name"], "input": c.get("input", {})}})
    return content


def stop_of(step):
    return step.get("stop", "tool_use" if step.get("calls") else "end_turn")


def checked(value, shape):
    """`value`, once botocore's validator and the constraints take it as `shape`."""
    report = ParamValidator().validate(value, shape)
    problems = []
    constraints(value, shape, "", problems)
    if report.has_errors() or problems:
        raise AssertionError(f"the mock's own {shape.name} is wrong: {report.generate_report()} {problems}")
    return value


def response_of(step):
    return checked({
        "output": {"message": {"role": "assistant", "content": content_of(step)}},
        "stopReason": stop_of(step),
        "usage": usage_of(step),
        "metrics": {"latencyMs": 1},
    }, RESPONSE)


def halves(text):
    half = len(text) // 2
    return [p for p in (text[:half], text[half:]) if p]


def events_of(step):
    """ConverseStream's events for one reply, in the documented order:
    messageStart; per block its deltas (a toolUse after its
    contentBlockStart) and contentBlockStop; messageStop; metadata."""
    yield "messageStart", {"role": "assistant"}
    for i, block in enumerate(content_of(step)):
        kind, v = only(block)
        if kind == "reasoningContent":
            for piece in halves(v["reasoningText"]["text"]):
                yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {"reasoningContent": {"text": piece}}}
            signature = v["reasoningText"]["signature"]
            yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {"reasoningContent": {"signature": signature}}}
        elif kind == "text":
            for piece in halves(v) or [""]:
                yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {"text": piece}}
        else:
            start = {"toolUse": {"toolUseId": v["toolUseId"], "name": v["name"]}}
            yield "contentBlockStart", {"contentBlockIndex": i, "start": start}
            for piece in halves(json.dumps(v["input"])):
                yield "contentBlockDelta", {"contentBlockIndex": i, "delta": {"toolUse": {"input": piece}}}
        yield "contentBlockStop", {"contentBlockIndex": i}
    yield "messageStop", {"stopReason": stop_of(step)}
    yield "metadata", {"usage": usage_of(step), "metrics": {"latencyMs": 1}}


PADDING = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def header(name, value):
    """One string header of the event-stream encoding."""
    name, value = name.encode(), value.encode()
    return struct.pack("!B", len(name)) + name + b"\x07" + struct.pack("!H", len(value)) + value


def frame(headers, payload):
    """One event-stream message: prelude (total, headers length, CRC),
    headers, payload, message CRC."""
    h = b"".join(header(k, v) for k, v in headers)
    total = 12 + len(h) + len(payload) + 4
    prelude = struct.pack("!II", total, len(h))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    message = prelude + h + payload
    return message + struct.pack("!I", zlib.crc32(message))


def event_frame(kind, payload, n=0):
    checked(payload, EVENTS.members[kind])
    # The service pads each payload with a `p` member of varying length
    # (no shape has it; every SDK passes it over).
    payload = dict(payload, p=PADDING[: (n * 7) % len(PADDING) + 1])
    return frame(
        [(":event-type", kind), (":content-type", "application/json"), (":message-type", "event")],
        json.dumps(payload).encode(),
    )


def exception_frame(kind, message):
    checked({"message": message}, EVENTS.members[kind])
    return frame(
        [(":exception-type", kind), (":content-type", "application/json"), (":message-type", "exception")],
        json.dumps({"message": message}).encode(),
    )


def reply(handler, step, model, stream):
    if "exception" in step and not stream:
        status = STATUS_OF_EXCEPTION.get(step["exception"], 500)
        return error(handler, status, step.get("message", "scripted"), None)
    if not stream:
        data = json.dumps(response_of(step)).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        handler.send_header("x-amzn-requestid", "mock-request")
        handler.end_headers()
        handler.wfile.write(data)
        return
    handler.send_response(200)
    handler.send_header("content-type", "application/vnd.amazon.eventstream")
    handler.send_header("x-amzn-requestid", "mock-request")
    handler.send_header("connection", "close")
    handler.end_headers()
    if "exception" in step:
        frames = [event_frame("messageStart", {"role": "assistant"}),
                  exception_frame(step["exception"], step.get("message", "scripted"))]
    else:
        frames = [event_frame(kind, payload, n) for n, (kind, payload) in enumerate(events_of(step))]
    for f in frames:
        handler.wfile.write(f)
        handler.wfile.flush()
    handler.close_connection = True


def error(handler, status, message, retry_after):
    """AWS's JSON error: `{"message"}`, the kind in `x-amzn-ErrorType`."""
    kind = ERROR_TYPES.get(status, "ValidationException" if status < 500 else "InternalServerException")
    data = json.dumps({"message": message}).encode()
    handler.send_response(status)
    handler.send_header("content-type", "application/json")
    handler.send_header("content-length", str(len(data)))
    handler.send_header("x-amzn-errortype", f"{kind}:http://internal.amazon.com/coral/com.amazon.bedrock/")
    handler.send_header("x-amzn-requestid", "mock-request")
    if retry_after is not None:
        handler.send_header("retry-after", str(retry_after))
    handler.end_headers()
    handler.wfile.write(data)
