"""The Bedrock mock proven with botocore's own client.

    tests/providers/.venv/bin/python tests/providers/selftest_bedrock.py

Starts mock.py --provider bedrock, and with botocore's bedrock-runtime
client (its serializer, its SigV4 signer, its response and event-stream
parsers) sends a two-turn tool conversation with thinking, whole and
streamed, and reads the answers; then checks the errors come back as
botocore reads AWS's, and that the mock refuses what the service would:
a member the model does not know, a toolResult answering no call, a
signature made with another secret. Exits non-zero on the first failure.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import botocore.auth
import botocore.credentials
import botocore.session
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.eventstream import EventStreamBuffer
from botocore.exceptions import ClientError, EventStreamError

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bedrock  # noqa: E402

ACCESS, SECRET, REGION, TOKEN = "AKIDMOCK", "mock/secret+key", "eu-west-1", "session-token"
MODEL = "eu.anthropic.claude-sonnet-4-20250514-v1:0"
ARN = "arn:aws:bedrock:eu-west-1:123456789012:inference-profile/eu.anthropic.claude-sonnet-4-20250514-v1:0"
TOOLS = {"tools": [
    {"toolSpec": {"name": "find", "description": "finds things",
                  "inputSchema": {"json": {"type": "object", "properties": {"q": {"type": "string"}}}}}},
    {"cachePoint": {"type": "default"}},
]}
THINKING = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
SCRIPT = [
    # converse: a call, with thinking; then the answer.
    {"thinking": "I should look it up", "text": "Looking.",
     "calls": [{"id": "tooluse_1", "name": "find", "input": {"q": "a"}},
               {"id": "tooluse_2", "name": "find", "input": {"q": "b"}}],
     "usage": {"input": 12, "output": 30, "cache_read": 100, "cache_write": 50}},
    {"text": "Both found."},
    # converse_stream: the same.
    {"thinking": "again", "calls": [{"id": "tooluse_3", "name": "find", "input": {"q": "c"}}]},
    {"text": "Found it.", "usage": {"input": 3, "output": 4}},
    # errors.
    {"status": 429, "retry_after": "2"},
    {"exception": "throttlingException", "message": "Too many requests, please wait"},
    {"status": 503},
]


def check(cond, what):
    if not cond:
        sys.exit(f"FAIL: {what}")
    print(f"ok: {what}")


def main():
    tmp = tempfile.mkdtemp()
    script, log = os.path.join(tmp, "script.json"), os.path.join(tmp, "log.jsonl")
    json.dump(SCRIPT, open(script, "w"))
    key = f"{ACCESS}:{SECRET}:{REGION}:{TOKEN}"
    mock = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "mock.py"), "--provider", "bedrock", "--key", key,
         "--script", script, "--log", log],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        port = int(mock.stdout.readline().split()[1])
        run(f"http://127.0.0.1:{port}", log)
    finally:
        mock.stdin.close()
        mock.wait(timeout=10)


def client(url, secret=SECRET):
    return botocore.session.get_session().create_client(
        "bedrock-runtime", endpoint_url=url, region_name=REGION,
        aws_access_key_id=ACCESS, aws_secret_access_key=secret, aws_session_token=TOKEN,
        config=Config(retries={"total_max_attempts": 1}),
    )


def records(log):
    return [json.loads(line) for line in open(log)]


def run(url, log):
    c = client(url)
    question = {"role": "user", "content": [{"text": "find a and b"}, {"cachePoint": {"type": "default"}}]}
    common = dict(system=[{"text": "be brief"}, {"cachePoint": {"type": "default"}}], toolConfig=TOOLS,
                  inferenceConfig={"maxTokens": 4096}, additionalModelRequestFields=THINKING)

    # Whole replies.
    first = c.converse(modelId=MODEL, messages=[question], **common)
    message = first["output"]["message"]
    kinds = [next(iter(b)) for b in message["content"]]
    check(kinds == ["reasoningContent", "text", "toolUse", "toolUse"], f"converse: the reply's blocks {kinds}")
    check(first["stopReason"] == "tool_use", "converse: stopReason tool_use")
    check(first["usage"] == {"inputTokens": 12, "outputTokens": 30, "totalTokens": 192,
                             "cacheReadInputTokens": 100, "cacheWriteInputTokens": 50}, "converse: usage")
    results = {"role": "user", "content": [
        {"toolResult": {"toolUseId": b["toolUse"]["toolUseId"], "content": [{"text": "found"}]}}
        for b in message["content"] if "toolUse" in b
    ]}
    second = c.converse(modelId=MODEL, messages=[question, message, results], **common)
    check(second["output"]["message"]["content"] == [{"text": "Both found."}], "converse: the second turn's answer")

    # Streamed replies, assembled as a client does.
    def streamed(messages):
        out = c.converse_stream(modelId=ARN, messages=messages, **common)
        blocks, stop, usage = {}, None, None
        for event in out["stream"]:
            if "contentBlockStart" in event:
                e = event["contentBlockStart"]
                tool = e["start"]["toolUse"]
                blocks[e["contentBlockIndex"]] = {"toolUse": {**tool, "input": ""}}
            elif "contentBlockDelta" in event:
                e = event["contentBlockDelta"]
                b = blocks.setdefault(e["contentBlockIndex"], {})
                d = e["delta"]
                if "text" in d:
                    b["text"] = b.get("text", "") + d["text"]
                elif "toolUse" in d:
                    b["toolUse"]["input"] += d["toolUse"]["input"]
                else:
                    r = b.setdefault("reasoningContent", {"reasoningText": {"text": ""}})["reasoningText"]
                    r["text"] += d["reasoningContent"].get("text", "")
                    if "signature" in d["reasoningContent"]:
                        r["signature"] = d["reasoningContent"]["signature"]
            elif "messageStop" in event:
                stop = event["messageStop"]["stopReason"]
            elif "metadata" in event:
                usage = event["metadata"]["usage"]
        content = [blocks[i] for i in sorted(blocks)]
        for b in content:
            if "toolUse" in b:
                b["toolUse"]["input"] = json.loads(b["toolUse"]["input"])
        return {"role": "assistant", "content": content}, stop, usage

    message, stop, usage = streamed([question])
    kinds = [next(iter(b)) for b in message["content"]]
    check(kinds == ["reasoningContent", "toolUse"] and stop == "tool_use", f"converse_stream: blocks {kinds}, {stop}")
    results = {"role": "user", "content": [
        {"toolResult": {"toolUseId": "tooluse_3", "content": [{"json": {"found": True}}]}}]}
    message, stop, usage = streamed([question, message, results])
    check(message["content"] == [{"text": "Found it."}] and stop == "end_turn", "converse_stream: the second turn")
    check(usage["totalTokens"] == 7, "converse_stream: metadata's usage")
    logged = records(log)
    check(len(logged) == 4 and all(r["key_ok"] and not r["violations"] for r in logged),
          "every request signed right and valid: " + "; ".join(v for r in logged for v in r["violations"]))
    check(logged[2]["path"].startswith("/model/arn%3Aaws%3Abedrock%3Aeu-west-1%3A123456789012%3Ainference-profile%2F"),
          f"an ARN is one encoded segment: {logged[2]['path']}")
    check([r["stream"] for r in logged] == [False, False, True, True], "the stream is told by the path")

    # Errors as botocore reads AWS's.
    try:
        c.converse(modelId=MODEL, messages=[question])
        check(False, "a 429 is an error")
    except ClientError as e:
        meta = e.response["ResponseMetadata"]
        check(e.response["Error"]["Code"] == "ThrottlingException" and meta["HTTPStatusCode"] == 429
              and meta["HTTPHeaders"].get("retry-after") == "2", "429: ThrottlingException with retry-after")
    try:
        for _ in c.converse_stream(modelId=MODEL, messages=[question])["stream"]:
            pass
        check(False, "a stream's exception is an error")
    except EventStreamError as e:
        check(e.response["Error"]["Code"] == "throttlingException"
              and "please wait" in e.response["Error"]["Message"], "a stream's throttlingException")
    try:
        c.converse(modelId=MODEL, messages=[question])
        check(False, "a 503 is an error")
    except ClientError as e:
        check(e.response["Error"]["Code"] == "ServiceUnavailableException", "503: ServiceUnavailableException")

    # What the mock refuses.
    def raw(body, secret=SECRET, path=f"/model/{MODEL.replace(':', '%3A')}/converse"):
        data = json.dumps(body).encode()
        req = AWSRequest(method="POST", url=url + path, data=data, headers={"content-type": "application/json"})
        creds = botocore.credentials.Credentials(ACCESS, secret, TOKEN)
        botocore.auth.SigV4Auth(creds, "bedrock", REGION).add_auth(req)
        prepared = req.prepare()
        r = urllib.request.Request(prepared.url, data=data, headers=dict(prepared.headers), method="POST")
        try:
            with urllib.request.urlopen(r) as resp:
                return resp.status, resp.headers, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()

    before = len(records(log))
    status, headers, _ = raw({"messages": [question], "temperature": 0.5})
    last = records(log)[-1]
    check(status == 400 and headers["x-amzn-errortype"].startswith("ValidationException")
          and any("temperature" in v for v in last["violations"]), "a member botocore does not know is refused")
    stray = {"role": "user", "content": [{"toolResult": {"toolUseId": "tooluse_9", "content": [{"text": "x"}]}}]}
    answer = {"role": "assistant", "content": [{"toolUse": {"toolUseId": "tooluse_8", "name": "find", "input": {}}}]}
    status, _, _ = raw({"messages": [question, answer, stray], "toolConfig": TOOLS})
    last = records(log)[-1]
    check(status == 400 and any("tooluse_9" in v for v in last["violations"]),
          "a toolResult answering no call is refused")
    status, _, _ = raw({"messages": [question, answer, {"role": "user", "content": [
        {"toolResult": {"toolUseId": "tooluse_8", "content": [{"text": "x"}]}}]}]})
    check(status == 400 and any("toolConfig must be defined" in v for v in records(log)[-1]["violations"]),
          "tool blocks without toolConfig are refused")
    forged = {"role": "assistant", "content": [
        {"reasoningContent": {"reasoningText": {"text": "changed", "signature": bedrock.sign("original")}}},
        {"text": "hi"}]}
    status, _, _ = raw({"messages": [question, forged, {"role": "user", "content": [{"text": "?"}]}]})
    check(status == 400 and any("signature" in v for v in records(log)[-1]["violations"]),
          "reasoning sent back changed is refused")
    status, _, _ = raw({"messages": [{"role": "user", "content": [{"text": "x"}]}]}, secret="another")
    last = records(log)[-1]
    check(status == 403 and not last["key_ok"] and not last["violations"], "a signature of another secret: 403")
    status, _, _ = raw({"messages": [question]}, path=f"/model/{MODEL}/converse")
    check(status == 400 and any("not encoded" in v for v in records(log)[-1]["violations"]),
          "a model id not encoded as botocore encodes it is refused")
    check(len(records(log)) == before + 6, "each refused request is logged")

    # The encoder, decoded by botocore's own event-stream buffer.
    buf = EventStreamBuffer()
    payload = b'{"stopReason":"end_turn"}'
    one = bedrock.frame([(":event-type", "messageStop"), (":content-type", "application/json"),
                         (":message-type", "event")], payload)
    buf.add_data(one + bedrock.event_frame("metadata", {"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2},
                                                         "metrics": {"latencyMs": 1}}))
    decoded = list(buf)
    check(decoded[0].headers[":event-type"] == "messageStop" and decoded[0].payload == payload
          and json.loads(decoded[1].payload)["usage"]["totalTokens"] == 2, "botocore decodes the encoder's frames")
    print("messageStop frame:", one.hex())
    print("all checks passed")


if __name__ == "__main__":
    main()
