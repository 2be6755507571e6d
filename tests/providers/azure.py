"""Azure OpenAI, played by the openai SDK's own types (mock.py's plugin).

Azure serves OpenAI's chat completions under a deployment's path,
`POST /openai/deployments/{deployment}/chat/completions?api-version=V`,
with the key in `api-key`, or an Entra ID access token as `Authorization:
Bearer`. The body is checked with the openai SDK's request types made
strict and OpenAI's rules (mock.py's), the path, the api-version and the
credential; the answers are mock.py's, chat completions whole or streamed.

The key argument is `api-key:VALUE` or `bearer:TOKEN`, and optionally
`@VERSION` after it: the api-version expected (2024-10-21 by default).
"""

import json
import re
import urllib.parse

import __main__ as mock

PATH = re.compile(r"^/openai/deployments/([A-Za-z0-9._-]+)/chat/completions$")


def request(handler, raw, key, violations):
    kind, _, value = key.partition(":")
    value, _, version = value.partition("@")
    url = urllib.parse.urlsplit(handler.path)
    m = PATH.match(url.path)
    if not m:
        violations.append(f"POST {url.path}, not /openai/deployments/<deployment>/chat/completions")
    query = urllib.parse.parse_qs(url.query)
    if query.get("api-version") != [version or "2024-10-21"]:
        violations.append(f"api-version {query.get('api-version')}, not {version or '2024-10-21'}")
    if kind == "api-key" and handler.headers.get("authorization") is not None:
        violations.append("an Authorization header beside the api-key")
    if kind == "bearer" and handler.headers.get("api-key") is not None:
        violations.append("an api-key header beside the Entra token")
    body = None
    try:
        body = json.loads(raw)
    except ValueError as e:
        violations.append(f"the body is not JSON: {e}")
    stream = bool(body and body.get("stream"))
    if body is not None:
        try:
            mock.drain(mock.OPENAI_REQUEST[stream].validate_python(body))
        except Exception as e:
            violations.append(f"the SDK's request type refuses it: {e}")
        violations.extend(mock.openai_rules(body))
    if kind == "api-key":
        key_ok = handler.headers.get("api-key") == value
    else:
        key_ok = handler.headers.get("authorization") == f"Bearer {value}"
    model = m.group(1) if m else "unknown"
    return body, stream, key_ok, model


def reply(handler, step, model, stream):
    if not stream:
        return handler.send(200, mock.completion_of(step, model).model_dump_json())
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("connection", "close")
    handler.end_headers()
    for chunk in mock.chunks_of(step, model):
        handler.wfile.write(f"data: {chunk.model_dump_json()}\n\n".encode())
        handler.wfile.flush()
    handler.wfile.write(b"data: [DONE]\n\n")
    handler.wfile.flush()
    handler.close_connection = True


def error(handler, status, message, retry_after):
    kind = {429: "rate_limit_error", 401: "authentication_error", 403: "authentication_error"}.get(
        status, "invalid_request_error")
    headers = [("retry-after", retry_after)] if retry_after else []
    handler.send(status, mock.error_body(kind, message, "openai"), headers)
