"""The Gemini mock (gemini.py, through mock.py) proven with google-genai's own client.

    tests/providers/.venv/bin/python tests/providers/selftest_gemini.py

The SDK's client holds a two-turn tool conversation with the mock, whole
and streamed, thinking on, and reads every answer without error; its
requests all pass the mock's checks. Then requests the mock must refuse
are refused: keys the SDK does not know, a function
response answering no call, a forged and a moved thought signature, a call
of the current turn without one, the key in the wrong place. Prints `ok`
and exits 0, or fails on the first thing wrong.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

from google import genai
from google.genai import errors
from google.genai import types as G

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "test-gemini-key"
MODEL = "gemini-test"

SCRIPT = [
    # 1, whole: parallel calls, Gemini giving no ids.
    {"thinking": "both, at once", "text": "Looking.", "calls": [
        {"name": "find", "input": {"q": "a"}}, {"name": "find", "input": {"q": "b"}}],
     "usage": {"input": 50, "output": 7, "cache_read": 30, "reasoning": 11}},
    # 2, whole: the answer, its text signed.
    {"thinking": "done", "text": "a and b found"},
    # 3, streamed: one call, with an id.
    {"thinking": "one more", "calls": [{"id": "call-c", "name": "find", "input": {"q": "c"}}]},
    # 4, streamed: the answer.
    {"thinking": "that is all", "text": "c found too", "usage": {"input": 80, "output": 4, "reasoning": 3}},
    # 5: an error.
    {"status": 429, "retry_after": "2"},
]


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def start(files):
    script = os.path.join(files, "script.json")
    log = os.path.join(files, "log.jsonl")
    with open(script, "w") as f:
        json.dump(SCRIPT, f)
    mock = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "mock.py"), "--provider", "gemini", "--key", KEY,
         "--script", script, "--log", log],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    line = mock.stdout.readline()
    check(line.startswith("PORT "), f"the mock printed {line!r}")
    return mock, int(line.split()[1]), log


def records(log):
    with open(log) as f:
        return [json.loads(line) for line in f]


def main():
    with tempfile.TemporaryDirectory() as files:
        mock, port, log = start(files)
        try:
            run(port, log)
        finally:
            mock.stdin.close()
            mock.wait(timeout=10)
    print("ok")


def run(port, log):
    base = f"http://127.0.0.1:{port}"
    client = genai.Client(api_key=KEY, http_options=G.HttpOptions(
        base_url=base, api_version="v1beta", retry_options=G.HttpRetryOptions(attempts=1)))
    config = G.GenerateContentConfig(
        system_instruction="be brief",
        tools=[G.Tool(function_declarations=[G.FunctionDeclaration(
            name="find", description="finds things",
            parameters_json_schema={"type": "object", "properties": {"q": {"type": "string"}},
                                    "required": ["q"], "additionalProperties": False})])],
        thinking_config=G.ThinkingConfig(thinking_budget=1024),
        max_output_tokens=1000,
        automatic_function_calling=G.AutomaticFunctionCallingConfig(disable=True),
    )
    history = [G.Content(role="user", parts=[G.Part(text="find a and b")])]

    # Whole: the calls, then the answer.
    first = client.models.generate_content(model=MODEL, contents=history, config=config)
    calls = first.function_calls
    check([c.args for c in calls] == [{"q": "a"}, {"q": "b"}], f"calls {calls}")
    check(all(c.id is None for c in calls), "Gemini gives no ids here")
    parts = first.candidates[0].content.parts
    check(parts[0].thought and parts[0].text == "both, at once", f"the thought {parts[0]}")
    check(parts[2].thought_signature and not parts[3].thought_signature, "the first call signed")
    u = first.usage_metadata
    check((u.prompt_token_count, u.cached_content_token_count, u.candidates_token_count,
           u.thoughts_token_count, u.total_token_count) == (80, 30, 7, 11, 98), f"usage {u}")
    history.append(first.candidates[0].content)
    history.append(G.Content(role="user", parts=[
        G.Part.from_function_response(name=c.name, response={"output": c.args["q"].upper()}) for c in calls]))
    second = client.models.generate_content(model=MODEL, contents=history, config=config)
    check(second.text == "a and b found", f"the answer {second.text!r}")
    history.append(second.candidates[0].content)
    history.append(G.Content(role="user", parts=[G.Part(text="and c?")]))

    # Streamed: the call, then the answer; each turn's parts put together
    # (the text's pieces joined, a signed part kept as it came).
    def streamed():
        parts, chunks = [], 0
        for chunk in client.models.generate_content_stream(model=MODEL, contents=history, config=config):
            chunks += 1
            for p in (chunk.candidates[0].content.parts if chunk.candidates[0].content else []):
                last = parts[-1] if parts else None
                plain = p.text is not None and p.thought_signature is None
                if plain and last and last.text is not None and last.thought_signature is None \
                        and bool(last.thought) == bool(p.thought):
                    last.text += p.text
                else:
                    parts.append(p)
        check(chunks >= 3, f"{chunks} chunks")
        return G.Content(role="model", parts=parts), chunk
    turn, last = streamed()
    call = [p.function_call for p in turn.parts if p.function_call]
    check(len(call) == 1 and call[0].id == "call-c", f"the streamed call {call}")
    history.append(turn)
    history.append(G.Content(role="user", parts=[G.Part(function_response=G.FunctionResponse(
        id="call-c", name="find", response={"output": "C"}))]))
    turn, last = streamed()
    text = "".join(p.text for p in turn.parts if p.text and not p.thought)
    check(text == "c found too", f"the streamed answer {text!r}")
    check(turn.parts[-1].text == "" and turn.parts[-1].thought_signature, "the signature alone, last")
    check(last.candidates[0].finish_reason == G.FinishReason.STOP, "the finish")
    check(last.usage_metadata.thoughts_token_count == 3, f"usage {last.usage_metadata}")
    history.append(turn)

    # An error, in Google's shape.
    try:
        client.models.generate_content(model=MODEL, contents=history + [
            G.Content(role="user", parts=[G.Part(text="again")])], config=config)
        fail("the scripted 429 was not an error")
    except errors.ClientError as e:
        check((e.code, e.status) == (429, "RESOURCE_EXHAUSTED"), f"the error {e.code} {e.status}")
        check(e.response.headers.get("retry-after") == "2", "retry-after")

    seen = records(log)
    check(len(seen) == 5, f"{len(seen)} requests logged")
    for r in seen:
        check(r["key_ok"] and not r["violations"], f"a request of the SDK refused: {r['violations']}")
    check([r["stream"] for r in seen] == [False, False, True, True, False], "streamed as asked")
    check(seen[0]["body"]["generationConfig"]["maxOutputTokens"] == 1000, "the config")

    # What the mock must refuse, each answered 400 without using a step.
    good = seen[1]["body"]

    def refused(body, expected, path=f"/v1beta/models/{MODEL}:generateContent", headers=None):
        data = json.dumps(body).encode()
        h = {"content-type": "application/json", "x-goog-api-key": KEY, **(headers or {})}
        try:
            urllib.request.urlopen(urllib.request.Request(base + path, data=data, headers=h))
            fail(f"accepted; expected {expected!r}")
        except urllib.error.HTTPError as e:
            check(e.code == 400, f"{e.code} for {expected!r}")
            error = json.loads(e.read())["error"]
            check(error["status"] == "INVALID_ARGUMENT" and error["code"] == 400, f"the error {error}")
            check(expected in error["message"], f"{expected!r} not in {error['message']!r}")

    def edited(change):
        body = json.loads(json.dumps(good))
        change(body)
        return body

    model_turn = good["contents"][1]
    refused(edited(lambda b: b["contents"][0]["parts"][0].update(bogus=1)), "Extra inputs are not permitted")
    refused(edited(lambda b: b.update(stream=True)), "Extra inputs")
    refused(edited(lambda b: b["generationConfig"]["thinkingConfig"].update(includeThought=True)), "Extra inputs")
    refused(edited(lambda b: b["contents"].insert(0, {"role": "user", "parts": [
        {"functionResponse": {"name": "find", "response": {"output": "?"}}}]})), "answering no call")
    refused(edited(lambda b: b["contents"][2]["parts"].pop()), "one each")
    forged = lambda b: b["contents"][1]["parts"][2].update(thoughtSignature="Zm9yZ2Vk")  # noqa: E731
    refused(edited(forged), "forged or moved")
    moved = lambda b: b["contents"][1]["parts"][3].update(  # noqa: E731
        thoughtSignature=b["contents"][1]["parts"][2]["thoughtSignature"])
    refused(edited(moved), "forged or moved")
    unsigned = lambda b: b["contents"][1]["parts"][2].pop("thoughtSignature")  # noqa: E731
    refused(edited(unsigned), "has no thought signature")
    check("thoughtSignature" in model_turn["parts"][2], "the SDK sent the signature back")
    refused(edited(lambda b: b["tools"][0]["functionDeclarations"][0].update(name="9lives")), "does not match")
    refused(good, "x-goog-api-key", headers={"authorization": f"Bearer {KEY}"})
    refused(good, "alt=sse", path=f"/v1beta/models/{MODEL}:streamGenerateContent")
    check(len(records(log)) == 5 + 11, "each refusal logged")


if __name__ == "__main__":
    main()
