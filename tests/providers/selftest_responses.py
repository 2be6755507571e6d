"""The Responses mock (responses.py) proven with the openai SDK's own client.

    tests/providers/.venv/bin/python tests/providers/selftest_responses.py

Starts `mock.py --provider responses`, has `client.responses.create(...)`
hold a two-turn tool conversation (reasoning sent back, two parallel calls
answered), whole and with `stream=True`, and read every answer; then sends
what the API refuses (a field the SDK does not know, an output answering no
call, a changed reasoning item, a wrong key, a call left unanswered) and
checks each is refused, and a scripted 429 arrives as the SDK's
RateLimitError with its retry-after. Exits non-zero on the first failure.
"""

import json
import os
import subprocess
import sys
import tempfile

import openai

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "sk-selftest"
MODEL = "gpt-test"
CALLS = [
    {"id": "call_a", "name": "find", "input": {"q": "a"}},
    {"id": "call_b", "name": "find", "input": {"q": "b"}},
]
USAGE = {"input": 20, "output": 8, "cache_read": 100, "cache_write": 4, "reasoning": 6}
SCRIPT = [
    {"thinking": "two lookups", "text": "Looking.", "calls": CALLS, "usage": USAGE},
    {"text": "a and b found"},
    {"thinking": "two lookups", "text": "Looking.", "calls": CALLS, "usage": USAGE},
    {"text": "a and b found, streamed", "incomplete": "max_output_tokens"},
    {"status": 429, "retry_after": "7"},
]
TOOLS = [{
    "type": "function", "name": "find", "description": "find things", "strict": False,
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}]


def check(ok, what):
    if not ok:
        sys.exit(f"FAILED: {what}")
    print(f"ok: {what}")


def first_turn():
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "look up a and b"}]}]


def second_turn(response):
    """The first turn, what the model said (reasoning as it came), the results."""
    items = first_turn()
    for item in response.output:
        if item.type == "reasoning":
            items.append(item.model_dump(exclude_none=True))
        elif item.type == "message":
            items.append({"type": "message", "role": "assistant", "content": response.output_text})
        elif item.type == "function_call":
            items.append({"type": "function_call", "call_id": item.call_id, "name": item.name,
                          "arguments": item.arguments})
    for item in response.output:
        if item.type == "function_call":
            items.append({"type": "function_call_output", "call_id": item.call_id,
                          "output": json.loads(item.arguments)["q"].upper()})
    return items


def create(client, items, **extra):
    return client.responses.create(
        model=MODEL, instructions="be brief", input=items, tools=TOOLS, parallel_tool_calls=True,
        store=False, include=["reasoning.encrypted_content"], max_output_tokens=1024, **extra,
    )


def main():
    work = tempfile.mkdtemp(prefix="responses-selftest-")
    script, log = os.path.join(work, "script.json"), os.path.join(work, "log.jsonl")
    with open(script, "w") as f:
        json.dump(SCRIPT, f)
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "mock.py"), "--provider", "responses", "--key", KEY,
         "--script", script, "--log", log],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        port = int(server.stdout.readline().split()[1])
        base = f"http://127.0.0.1:{port}/v1"
        client = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0)
        run(client, openai.OpenAI(base_url=base, api_key="sk-wrong", max_retries=0), log)
    finally:
        server.stdin.close()
        server.wait(timeout=10)


def run(client, stranger, log):
    # Whole: the first turn, then the second with the reasoning and results.
    first = create(client, first_turn())
    kinds = [i.type for i in first.output]
    check(kinds == ["reasoning", "message", "function_call", "function_call"], f"first answer's items {kinds}")
    check(first.output_text == "Looking.", "the text is the message's, not the reasoning summary")
    check(first.output[0].encrypted_content is not None, "the reasoning item is encrypted")
    u = first.usage
    check((u.input_tokens, u.input_tokens_details.cached_tokens, u.input_tokens_details.cache_write_tokens,
           u.output_tokens, u.output_tokens_details.reasoning_tokens) == (120, 100, 4, 14, 6), f"usage {u}")
    second = create(client, second_turn(first))
    check(second.output_text == "a and b found" and second.status == "completed", "second answer read")

    # Streamed: the same conversation, events in the documented order.
    with create(client, first_turn(), stream=True) as events:
        seen = [e for e in events]
    types = [e.type for e in seen]
    check(types[:2] == ["response.created", "response.in_progress"], "the stream opens")
    check(types[-1] == "response.completed", "the stream completes")
    check([e.sequence_number for e in seen] == list(range(len(seen))), "sequence numbers in order")
    text = "".join(e.delta for e in seen if e.type == "response.output_text.delta")
    check(text == "Looking.", "the text's deltas")
    args = "".join(e.delta for e in seen if e.type == "response.function_call_arguments.delta")
    check(args == '{"q": "a"}{"q": "b"}', f"the arguments' deltas {args!r}")
    done = [e.item for e in seen if e.type == "response.output_item.done"]
    added = [e.item for e in seen if e.type == "response.output_item.added"]
    check(added[0].encrypted_content is None and done[0].encrypted_content, "encrypted content whole at .done")
    streamed = seen[-1].response
    check(streamed.output == done, "completed carries the items as done")
    with create(client, second_turn(streamed), stream=True) as events:
        last = [e for e in events][-1]
    check(last.type == "response.incomplete" and last.response.incomplete_details.reason == "max_output_tokens",
          "an incomplete streamed answer")

    # What the API refuses is refused (and uses no script step).
    def refused(what, status, call):
        try:
            call()
        except openai.APIStatusError as e:
            check(e.status_code == status and "error" in e.response.json(), f"{what}: HTTP {e.status_code}: "
                  f"{e.response.json()['error']['message'][:150]}")
            return
        sys.exit(f"FAILED: {what} was accepted")

    refused("a field the SDK does not know", 400, lambda: create(client, first_turn(), extra_body={"frobnicate": 1}))
    orphan = first_turn() + [{"type": "function_call_output", "call_id": "call_zz", "output": "?"}]
    refused("an output answering no call", 400, lambda: create(client, orphan))
    unanswered = second_turn(first)[:-1]
    refused("a call left unanswered", 400, lambda: create(client, unanswered))
    changed = second_turn(first)
    changed[1]["summary"][0]["text"] = "something else"
    refused("a changed reasoning item", 400, lambda: create(client, changed))
    bare = second_turn(first)
    del bare[1]["encrypted_content"]
    refused("a reasoning item without its encrypted content", 400, lambda: create(client, bare))
    try:
        create(client, first_turn())
        sys.exit("FAILED: the scripted 429 was not answered")
    except openai.RateLimitError as e:
        check(e.response.headers.get("retry-after") == "7", "a scripted 429 with its retry-after")
    refused("a wrong key", 403, lambda: create(stranger, first_turn()))

    with open(log) as f:
        records = [json.loads(line) for line in f]
    clean = [r for r in records if not r["violations"]]
    check(len(clean) == 6 and all(r["path"] == "/v1/responses" for r in clean),
          "every request of the SDK's but the wrong ones passed validation")
    check([r["key_ok"] for r in clean] == [True] * 5 + [False], "the key checked")
    check(len(records) - len(clean) == 5, "the five wrong requests were logged with their violations")
    print("the Responses mock holds")


if __name__ == "__main__":
    main()
