"""OpenAI's Responses API (`POST /v1/responses`), played by the openai SDK's
own types: a provider module of mock.py (`--provider responses`, see
`PLUGINS` there).

A request is validated with `ResponseCreateParamsNonStreaming` /
`ResponseCreateParamsStreaming` made strict (a key the SDK does not know is
refused), then with what the API documents and the types cannot say:
Bindery's stateless use (`store: false`, no `previous_response_id`, the
reasoning asked back encrypted), tool names, `call_id`s (at most 64), each
`function_call_output` answering a `function_call` earlier in the input and
each call answered, arguments that are JSON text, item ids of their kind's
prefix, reasoning items sent back unchanged (their `encrypted_content` is
the mock's signature of their id and summary) and followed by an item,
media as data URLs.

A script step's answer is an `openai.types.responses.Response`: "thinking"
becomes a reasoning item (the text its summary, with `encrypted_content`),
"text" an output message, "calls" `function_call` items (each step's
"id" the `call_id`); usage is input + cache_read input tokens (cache_read
of them cached, cache_write written), output + reasoning output tokens
(reasoning of them reasoning). A step may say "incomplete":
"max_output_tokens" for a response cut there. Streamed, it is the typed
`ResponseStreamEvent`s in the documented order, as SSE `event: <type>` and
`data: <json>`. Errors are OpenAI's `{"error": {message, type, param,
code}}` with the status (and `retry-after` when the step gives one).
"""

import json
import re
import sys

from pydantic import TypeAdapter

import openai.types.responses as R
from openai.types.responses import response_create_params, response_reasoning_item
from openai.types.responses import response_usage
from openai.types.shared import ErrorObject


def _mock():
    """mock.py's helpers: the running `__main__`, or mock imported."""
    main = sys.modules.get("__main__")
    if main is not None and hasattr(main, "strict_sdk_types") and hasattr(main, "PLUGINS"):
        return main
    import mock

    return mock


M = _mock()
M.strict_sdk_types("openai.types")
REQUEST = {
    False: TypeAdapter(response_create_params.ResponseCreateParamsNonStreaming),
    True: TypeAdapter(response_create_params.ResponseCreateParamsStreaming),
}
TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
PREFIX = {"reasoning": "rs_", "function_call": "fc_", "message": "msg_"}


def encrypted(item_id, summary):
    """What the mock gives a reasoning item as its encrypted content."""
    return M.sign(item_id + "\n" + "\n".join(summary))


def request(handler, raw, key, violations):
    path = handler.path.split("?")[0]
    if not path.endswith("/v1/responses"):
        violations.append(f"POST {handler.path}, not /v1/responses")
    if handler.headers.get("x-api-key") is not None:
        violations.append("an x-api-key header: OpenAI's key goes in Authorization")
    if not (handler.headers.get("content-type") or "").startswith("application/json"):
        violations.append(f"content-type {handler.headers.get('content-type')!r}, not application/json")
    key_ok = handler.headers.get("authorization") == f"Bearer {key}"
    try:
        body = json.loads(raw)
    except ValueError as e:
        violations.append(f"the body is not JSON: {e}")
        return None, False, key_ok, None
    if not isinstance(body, dict):
        violations.append("the body is not an object")
        return body, False, key_ok, None
    stream = body.get("stream") is True
    try:
        M.drain(REQUEST[stream].validate_python(body))
    except Exception as e:
        violations.append(f"the SDK's request type refuses it: {e}")
    else:
        violations.extend(rules(body))
    return body, stream, key_ok, body.get("model")


def rules(body):
    """What the API documents beyond the types, and Bindery's stateless use."""
    out = []
    if body.get("store") is not False:
        out.append("store is not false: Bindery keeps the history, OpenAI must not")
    if body.get("previous_response_id") is not None or body.get("conversation") is not None:
        out.append("previous_response_id or conversation: with store false nothing is kept to refer to")
    if "reasoning.encrypted_content" not in (body.get("include") or []):
        out.append("include lacks reasoning.encrypted_content: reasoning cannot be sent back with store false")
    if body.get("stream_options") is not None and not body.get("stream"):
        out.append("stream_options without stream")
    max_output = body.get("max_output_tokens")
    if max_output is not None and max_output < 16:
        out.append(f"max_output_tokens {max_output} is below the minimum, 16")
    for tool in body.get("tools") or []:
        if tool.get("type") != "function":
            out.append(f"a tool of type {tool.get('type')!r}: Bindery offers functions only")
            continue
        if not TOOL_NAME.match(tool.get("name", "")):
            out.append(f"tool name {tool.get('name')!r} does not match {TOOL_NAME.pattern}")
        if (tool.get("parameters") or {}).get("type") != "object":
            out.append(f"tool {tool.get('name')!r}: parameters.type must be object")
    items = body.get("input")
    if not isinstance(items, list):
        return out + ["input is not a list of items"]
    calls, answered = {}, set()
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if item.get("id") is not None and kind in PREFIX and not str(item["id"]).startswith(PREFIX[kind]):
            out.append(f"input[{i}].id {item['id']!r}: a {kind} id begins with {PREFIX[kind]!r}")
        if kind == "function_call":
            call_id = item.get("call_id", "")
            if not 1 <= len(call_id) <= 64:
                out.append(f"input[{i}].call_id {call_id!r}: 1 to 64 characters")
            if call_id in calls:
                out.append(f"input[{i}].call_id {call_id!r} is input[{calls[call_id]}]'s too")
            calls[call_id] = i
            try:
                json.loads(item.get("arguments", ""))
            except ValueError:
                out.append(f"input[{i}]: the call's arguments are not JSON text")
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                out.append(f"input[{i}]: no function call found for function_call_output with call_id {call_id!r}")
            elif call_id in answered:
                out.append(f"input[{i}]: call {call_id!r} is answered twice")
            answered.add(call_id)
        elif kind == "reasoning":
            summary = [s.get("text", "") for s in item.get("summary", [])]
            if item.get("encrypted_content") != encrypted(item.get("id", ""), summary):
                out.append(
                    f"input[{i}]: reasoning item {item.get('id')!r} without the encrypted_content the API "
                    f"gave it (with store false its id names nothing), or changed"
                )
            if i + 1 == len(items):
                out.append(f"input[{i}]: reasoning item {item.get('id')!r} provided without its required following item")
        for part in content_parts(item):
            if part.get("type") == "input_image" and not re.match(r"^(data:image/[a-z]+;base64,|https?://)", part.get("image_url") or ""):
                out.append(f"input[{i}]: an input_image's image_url is neither a data URL nor http(s)")
            if part.get("type") == "input_file" and not re.match(r"^data:[a-z]+/[a-z0-9.+-]+;base64,", part.get("file_data") or ""):
                out.append(f"input[{i}]: an input_file's file_data is not a base64 data URL")
    for call_id, i in calls.items():
        if call_id not in answered:
            out.append(f"input[{i}]: no tool output found for function call {call_id!r}")
    return out


def content_parts(item):
    """The parts of a message's content or of a function's output."""
    for key in ("content", "output"):
        value = item.get(key)
        if isinstance(value, list):
            yield from (p for p in value if isinstance(p, dict))


def usage_of(step):
    u = step.get("usage", {})
    cached, written = u.get("cache_read", 0), u.get("cache_write", 0)
    reasoning = u.get("reasoning", 0)
    input_tokens = u.get("input", 10) + cached
    output_tokens = u.get("output", 5) + reasoning
    return R.ResponseUsage(
        input_tokens=input_tokens,
        input_tokens_details=response_usage.InputTokensDetails(cached_tokens=cached, cache_write_tokens=written),
        output_tokens=output_tokens,
        output_tokens_details=response_usage.OutputTokensDetails(reasoning_tokens=reasoning),
        total_tokens=input_tokens + output_tokens,
    )


def output_of(step):
    out = []
    if "thinking" in step:
        item_id = "rs_mock"
        summary = [step["thinking"]]
        out.append(R.ResponseReasoningItem(
            id=item_id, type="reasoning",
            summary=[response_reasoning_item.Summary(type="summary_text", text=t) for t in summary],
            encrypted_content=encrypted(item_id, summary),
        ))
    if "text" in step:
        out.append(R.ResponseOutputMessage(
            id="msg_mock", type="message", role="assistant", status="completed",
            content=[R.ResponseOutputText(type="output_text", text=step["text"], annotations=[])],
        ))
    for i, c in enumerate(step.get("calls", [])):
        out.append(R.ResponseFunctionToolCall(
            id=f"fc_mock_{i}", type="function_call", call_id=c["id"], name=c["name"],
            arguments=json.dumps(c.get("input", {})), status="completed",
        ))
    return out


def response_of(step, model, output=None, status=None):
    incomplete = step.get("incomplete")
    if status is None:
        status = "incomplete" if incomplete else "completed"
    return R.Response(
        id="resp_mock", object="response", created_at=0, model=model,
        output=output_of(step) if output is None else output,
        parallel_tool_calls=True, tool_choice="auto", tools=[], status=status,
        incomplete_details=R.response.IncompleteDetails(reason=incomplete) if incomplete and status != "in_progress" else None,
        usage=usage_of(step) if status != "in_progress" else None,
        error=None,
    )


def halves(text):
    half = len(text) // 2
    return [text[:half], text[half:]]


def events_of(step, model):
    """The events of one streamed response, in the order the API documents."""
    started = response_of(step, model, output=[], status="in_progress")
    yield R.ResponseCreatedEvent(type="response.created", response=started, sequence_number=0)
    yield R.ResponseInProgressEvent(type="response.in_progress", response=started, sequence_number=0)
    for i, item in enumerate(output_of(step)):
        common = {"output_index": i, "sequence_number": 0}
        ids = {"item_id": item.id, **common}
        if item.type == "reasoning":
            # The encrypted content is whole only in the item's `.done`.
            opening = item.model_copy(update={"summary": [], "encrypted_content": None})
            yield R.ResponseOutputItemAddedEvent(type="response.output_item.added", item=opening, **common)
            for s, summary in enumerate(item.summary):
                part = {"type": "summary_text", "text": ""}
                yield R.ResponseReasoningSummaryPartAddedEvent(
                    type="response.reasoning_summary_part.added", summary_index=s, part=part, **ids)
                for piece in halves(summary.text):
                    yield R.ResponseReasoningSummaryTextDeltaEvent(
                        type="response.reasoning_summary_text.delta", summary_index=s, delta=piece, **ids)
                yield R.ResponseReasoningSummaryTextDoneEvent(
                    type="response.reasoning_summary_text.done", summary_index=s, text=summary.text, **ids)
                yield R.ResponseReasoningSummaryPartDoneEvent(
                    type="response.reasoning_summary_part.done", summary_index=s,
                    part={"type": "summary_text", "text": summary.text}, **ids)
        elif item.type == "message":
            opening = item.model_copy(update={"content": [], "status": "in_progress"})
            yield R.ResponseOutputItemAddedEvent(type="response.output_item.added", item=opening, **common)
            for c, part in enumerate(item.content):
                empty = R.ResponseOutputText(type="output_text", text="", annotations=[])
                yield R.ResponseContentPartAddedEvent(
                    type="response.content_part.added", content_index=c, part=empty, **ids)
                for piece in halves(part.text):
                    yield R.ResponseTextDeltaEvent(
                        type="response.output_text.delta", content_index=c, delta=piece, logprobs=[], **ids)
                yield R.ResponseTextDoneEvent(
                    type="response.output_text.done", content_index=c, text=part.text, logprobs=[], **ids)
                yield R.ResponseContentPartDoneEvent(
                    type="response.content_part.done", content_index=c, part=part, **ids)
        else:
            opening = item.model_copy(update={"arguments": "", "status": "in_progress"})
            yield R.ResponseOutputItemAddedEvent(type="response.output_item.added", item=opening, **common)
            for piece in halves(item.arguments):
                yield R.ResponseFunctionCallArgumentsDeltaEvent(
                    type="response.function_call_arguments.delta", delta=piece, **ids)
            yield R.ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done", arguments=item.arguments, **ids)
        yield R.ResponseOutputItemDoneEvent(type="response.output_item.done", item=item, **common)
    final = response_of(step, model)
    if final.status == "incomplete":
        yield R.ResponseIncompleteEvent(type="response.incomplete", response=final, sequence_number=0)
    else:
        yield R.ResponseCompletedEvent(type="response.completed", response=final, sequence_number=0)


def reply(handler, step, model, stream):
    if not stream:
        return handler.send(200, response_of(step, model).model_dump_json())
    handler.send_response(200)
    handler.send_header("content-type", "text/event-stream")
    handler.send_header("connection", "close")
    handler.end_headers()
    for n, event in enumerate(events_of(step, model)):
        event.sequence_number = n
        handler.wfile.write(f"event: {event.type}\ndata: {event.model_dump_json()}\n\n".encode())
        handler.wfile.flush()
    handler.close_connection = True


ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


def error(handler, status, message, retry_after):
    kind, code = ERRORS.get(status, ("server_error", None) if status >= 500 else ("invalid_request_error", None))
    body = json.dumps({"error": ErrorObject(message=message, type=kind, param=None, code=code).model_dump(mode="json", exclude={"misalignment"})})
    headers = [("retry-after", str(retry_after))] if retry_after is not None else []
    handler.send(status, body, headers)
