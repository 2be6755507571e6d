"""Google's Gemini API (generateContent), played by google-genai's own types.

A provider module of mock.py (see `PLUGINS` there):

- a request is POST /v1beta/models/{model}:generateContent, or
  :streamGenerateContent?alt=sse, its key in `x-goog-api-key` (never an
  Authorization header, nor `key=` in the URL); its JSON body is validated
  with the SDK's pydantic types (Content, Part, Tool, FunctionDeclaration,
  GenerationConfig, ...: extra keys forbidden by the SDK itself; a field
  spelled camelCase or snake_case, as the SDK's models take it and as
  proto3 JSON parsers do: the SDK itself sends `thinking_budget` and
  `parameters_json_schema` so); then with the rules Google documents and
  the types cannot say: tool names, one kind of
  data per part, function responses answering the calls of the model turn
  just before them (as many, the same names, the same ids when the calls
  had some), and thought signatures: each must be the one this mock gave
  that very part (an HMAC of its content, like mock.py's `sign`, so a
  forged or moved one is caught), the first call of each step of the
  current turn must carry one (Gemini 3 answers 400 otherwise; the
  documented `skip_thought_signature_validator` stands for a call Gemini
  did not make), and a turn that had a thought and text gives its text's
  signature back;
- a reply is a `GenerateContentResponse` built from the script step: the
  "thinking" as a thought part, the text, the calls as functionCall parts
  (with the step's `id` when the call has one, none otherwise: Gemini's
  API gives none on most models), a signature on the first call (or on
  the text when there is no call), and usage with the cache's reads and
  the thoughts (`usage.reasoning`); streamed as SSE `data:` chunks the way
  Gemini splits them: the thought and the text in pieces, the calls whole
  in one chunk, and a last chunk with the finish, the usage and the text's
  signature alone on an empty text part;
- an error is Google's `{"error": {"code", "message", "status"}}` with the
  status (and `retry-after` when the step has one).
"""

import base64
import binascii
import hashlib
import hmac
import itertools
import json
import re
from typing import Optional
from urllib.parse import parse_qs, unquote, urlsplit

import pydantic
from google.genai import types as G
from pydantic.alias_generators import to_camel

SIGNING_KEY = b"mock-provider"
FOREIGN_SIGNATURE = "skip_thought_signature_validator"
PATH = re.compile(r"^/v1beta/models/([^/:]+):(generateContent|streamGenerateContent)$")
# The Gemini API's rule (generativelanguage v1beta FunctionDeclaration.name,
# and the SDK's "must start with a letter or an underscore").
TOOL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_.:-]{0,63}$")
# The fields of a Part that are its data: exactly one per part.
DATA = ("text", "functionCall", "functionResponse", "inlineData", "fileData",
        "executableCode", "codeExecutionResult", "toolCall", "toolResponse")
STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
          429: "RESOURCE_EXHAUSTED", 500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
RESPONSE_IDS = itertools.count(1)


class Request(pydantic.BaseModel):
    """The REST body of generateContent (models.py's
    `_GenerateContentParameters_to_mldev` and `_GenerateContentConfig_to_mldev`
    write it), of the SDK's own types, spelled as they are (see the module's
    docs)."""
    model_config = pydantic.ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True)

    contents: list[G.Content]
    system_instruction: Optional[G.Content] = None
    tools: Optional[list[G.Tool]] = None
    tool_config: Optional[G.ToolConfig] = None
    safety_settings: Optional[list[G.SafetySetting]] = None
    generation_config: Optional[G.GenerationConfig] = None
    cached_content: Optional[str] = None


def sign(what):
    """The signature this mock gives a part: bytes, as `Part.thought_signature`."""
    return hmac.new(SIGNING_KEY, what.encode(), hashlib.sha256).digest()


def call_signature(call):
    return sign("call:" + json.dumps({"name": call.get("name"), "args": call.get("args") or {}}, sort_keys=True))


def text_signature(text):
    return sign("text:" + text)


def decoded(signature):
    """A signature as the bytes it stands for (base64, either alphabet)."""
    if not isinstance(signature, str):
        return None
    padded = signature + "=" * (-len(signature) % 4)
    try:
        return base64.b64decode(padded.replace("-", "+").replace("_", "/"), validate=True)
    except (binascii.Error, ValueError):
        return None


def turns(contents):
    """Consecutive contents of one role are one turn (the API joins them)."""
    out = []
    for c in contents:
        role, parts = c.get("role"), c.get("parts") or []
        if out and out[-1][0] == role:
            out[-1][1].extend(parts)
        else:
            out.append((role, list(parts)))
    return out


def documented_rules(body):
    """What Google's docs require beyond the types, as messages."""
    out = []
    names = []
    for tool in body.get("tools") or []:
        for d in tool.get("functionDeclarations") or []:
            name = d.get("name", "")
            names.append(name)
            if not TOOL_NAME.match(name):
                out.append(f"function name {name!r} does not match {TOOL_NAME.pattern}")
            if "parameters" in d and "parametersJsonSchema" in d:
                out.append(f"function {name!r}: parameters and parametersJsonSchema are mutually exclusive")
            schema = d.get("parametersJsonSchema")
            if schema is not None and (not isinstance(schema, dict) or schema.get("type") != "object"):
                out.append(f"function {name!r}: parametersJsonSchema must describe an object")
    if len(names) != len(set(names)):
        out.append(f"function names {names} are not distinct")
    contents = body.get("contents") or []
    if not contents:
        out.append("no contents")
    all_turns = turns(contents)
    # The current turn begins at the last user turn that says something
    # (not only function responses): Gemini 3 checks signatures there.
    current = 0
    for i, (role, parts) in enumerate(all_turns):
        if role not in ("user", "model"):
            out.append(f"turn {i}: role {role!r}, not user or model")
        for p in parts:
            data = [k for k in DATA if p.get(k) is not None]
            if len(data) != 1:
                out.append(f"turn {i}: a part with {data or 'no data'}, not exactly one kind of data")
            if role != "model" and ("functionCall" in p or p.get("thought") or "thoughtSignature" in p):
                out.append(f"turn {i}: a {role} part with a model's call, thought or signature")
            if role != "user" and "functionResponse" in p:
                out.append(f"turn {i}: a function response in a {role} turn")
        if role == "user" and any("functionResponse" not in p for p in parts):
            current = i
    for i, (role, parts) in enumerate(all_turns):
        if role == "model":
            out.extend(signature_rules(i, parts, i > current))
        calls = [p["functionCall"] for p in parts if role == "model" and "functionCall" in p]
        responses = [p["functionResponse"] for p in parts if role == "user" and "functionResponse" in p]
        before = all_turns[i - 1] if i else ("", [])
        answered = [p["functionCall"] for p in before[1] if before[0] == "model" and "functionCall" in p]
        if responses and not answered:
            out.append(f"turn {i}: function responses answering no call of the turn before")
        elif responses:
            if sorted(r.get("name", "") for r in responses) != sorted(c.get("name", "") for c in answered):
                out.append(
                    f"turn {i}: function responses {[r.get('name') for r in responses]} must answer the calls "
                    f"{[c.get('name') for c in answered]} of turn {i - 1}, one each"
                )
            for c in answered:
                if c.get("id") and c["id"] not in [r.get("id") for r in responses]:
                    out.append(f"turn {i}: no function response with the id {c['id']!r} of its call")
        if calls and i + 1 < len(all_turns):
            following = all_turns[i + 1][1]
            if not any("functionResponse" in p for p in following):
                out.append(f"turn {i + 1}: the calls of turn {i} are not answered")
    return out


def signature_rules(i, parts, current):
    """Each signature the one given to its part; the first call of a step
    of the current turn signed; a thinking turn's text signed."""
    out = []
    text = "".join(p.get("text", "") for p in parts if "text" in p and not p.get("thought"))
    for p in parts:
        given = p.get("thoughtSignature")
        if given is None:
            continue
        if given == FOREIGN_SIGNATURE:
            if "functionCall" not in p:
                out.append(f"turn {i}: {FOREIGN_SIGNATURE!r} on a part that is not a call")
            continue
        if "functionCall" in p:
            expected = call_signature(p["functionCall"])
        elif "text" in p and not p.get("thought"):
            expected = text_signature(text)
        else:
            expected = None
        if decoded(given) != expected:
            out.append(f"turn {i}: a thought signature that is not the one given to this part (forged or moved)")
    calls = [p for p in parts if "functionCall" in p]
    if current and calls and calls[0].get("thoughtSignature") is None:
        out.append(f"turn {i}: the first function call of a step of the current turn has no thought signature")
    thought = any(p.get("thought") for p in parts)
    if thought and not calls and text and not any("thoughtSignature" in p and "text" in p for p in parts):
        out.append(f"turn {i}: the text of a turn that thought came back without its signature")
    return out


def request(handler, raw, key, violations):
    url = urlsplit(handler.path)
    m = PATH.match(url.path)
    model, stream = None, False
    if m is None:
        violations.append(f"POST {url.path}, not /v1beta/models/{{model}}:generateContent or :streamGenerateContent")
    else:
        model, stream = unquote(m[1]), m[2] == "streamGenerateContent"
    query = parse_qs(url.query, keep_blank_values=True)
    if "key" in query:
        violations.append("the key in the URL: it goes in x-goog-api-key")
    if stream and query.get("alt") != ["sse"]:
        violations.append(f"a stream asked for without alt=sse: {url.query!r}")
    if set(query) - {"alt"} or (not stream and query):
        violations.append(f"query parameters {url.query!r}")
    if handler.headers.get("authorization") is not None:
        violations.append("an Authorization header: the Gemini API's key goes in x-goog-api-key")
    if not (handler.headers.get("content-type") or "").startswith("application/json"):
        violations.append(f"content-type {handler.headers.get('content-type')!r}")
    body = None
    try:
        body = json.loads(raw)
    except ValueError as e:
        violations.append(f"the body is not JSON: {e}")
    if isinstance(body, dict):
        try:
            Request.model_validate_json(raw)
        except pydantic.ValidationError as e:
            violations.append(f"the SDK's types refuse it: {e}")
        else:
            violations.extend(documented_rules(body))
    elif body is not None:
        violations.append("the body is not an object")
    return body, stream, handler.headers.get("x-goog-api-key") == key, model


def usage_of(step, final=True):
    u = step.get("usage", {})
    prompt = u.get("input", 10) + u.get("cache_read", 0)
    output, thoughts = (u.get("output", 5), u.get("reasoning", 0)) if final else (0, 0)
    return G.GenerateContentResponseUsageMetadata(
        prompt_token_count=prompt,
        cached_content_token_count=u.get("cache_read") or None,
        candidates_token_count=output,
        thoughts_token_count=thoughts or None,
        total_token_count=prompt + output + thoughts,
    )


def call_parts(step):
    parts = []
    for n, c in enumerate(step.get("calls", [])):
        call = G.FunctionCall(name=c["name"], args=c.get("input", {}), id=c.get("id"))
        signature = call_signature({"name": c["name"], "args": c.get("input", {})}) if n == 0 else None
        parts.append(G.Part(function_call=call, thought_signature=signature))
    return parts


def parts_of(step):
    parts = []
    if "thinking" in step:
        parts.append(G.Part(text=step["thinking"], thought=True))
    if "text" in step:
        signature = None if step.get("calls") else text_signature(step["text"])
        parts.append(G.Part(text=step["text"], thought_signature=signature))
    return parts + call_parts(step)


def response_of(step, model, parts, finish="STOP", usage=None):
    candidate = G.Candidate(
        content=G.Content(role="model", parts=parts) if parts else None,
        finish_reason=finish,
        index=0,
    )
    return G.GenerateContentResponse(
        candidates=[candidate], usage_metadata=usage or usage_of(step), model_version=model,
        response_id=f"mock-{next(RESPONSE_IDS)}",
    )


def halves(text):
    half = len(text) // 2
    return [piece for piece in (text[:half], text[half:]) if piece]


def chunks_of(step, model):
    """A streamed reply in the chunks Gemini sends (one response id)."""
    response_id = f"mock-{next(RESPONSE_IDS)}"

    def chunk(parts, finish=None, final=False):
        candidate = G.Candidate(content=G.Content(role="model", parts=parts) if parts else None,
                                finish_reason=finish, index=0)
        return G.GenerateContentResponse(candidates=[candidate], usage_metadata=usage_of(step, final),
                                         model_version=model, response_id=response_id)

    for piece in halves(step.get("thinking", "")):
        yield chunk([G.Part(text=piece, thought=True)])
    for piece in halves(step.get("text") or ""):
        yield chunk([G.Part(text=piece)])
    if step.get("calls"):
        yield chunk(call_parts(step))
        yield chunk([], finish="STOP", final=True)
    elif "text" in step:
        signed = G.Part(text="", thought_signature=text_signature(step["text"]))
        yield chunk([signed], finish="STOP", final=True)
    else:
        yield chunk([], finish="STOP", final=True)


def dumped(response):
    return response.model_dump_json(by_alias=True, exclude_none=True)


def reply(handler, step, model, stream):
    if not stream:
        return handler.send(200, dumped(response_of(step, model, parts_of(step))))
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("connection", "close")
    handler.end_headers()
    for chunk in chunks_of(step, model):
        handler.wfile.write(f"data: {dumped(chunk)}\r\n\r\n".encode())
        handler.wfile.flush()
    handler.close_connection = True


def error(handler, status, message, retry_after):
    body = json.dumps({"error": {"code": status, "message": message, "status": STATUS.get(status, "UNKNOWN")}})
    headers = [("retry-after", str(retry_after))] if retry_after is not None else []
    handler.send(status, body, headers)
