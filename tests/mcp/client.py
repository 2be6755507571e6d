"""Drive an MCP server with the official Python SDK, as a user's client would.

Reads a plan as JSON on stdin:

    {"url": "http://127.0.0.1:PORT/mcp",
     "connections": [
        {"headers": {"Authorization": "Bearer …", "Agents-Param-tenant": "acme"},
         "calls": [{"tool": "ask_invoices", "arguments": {"prompt": "…"},
                    "meta": {"agents-exe/params": {…}}}]}]}

Each connection opens the Streamable HTTP transport with its headers, runs
`initialize` and `tools/list`, then each call in order. Prints one JSON
object on stdout: per connection the initialize result, the tools, and per
call its result or its JSON-RPC error (`{"error": {code, message, data}}`).
A connection whose `initialize` fails records that error and stops there.

A connection with `"mode": "2026-07-28"` uses the SDK's `Client` instead
(no handshake: every request describes itself). With `"elicit": [...]` it
declares elicitation and answers each form the server asks with the next
entry (`{"action": "accept", "content": {...}}`, or `{"choose": LABEL}` to
accept the option titled LABEL); the forms asked are recorded under
`elicitations`.
Run by sidecar/tests/it/mcp_server.rs and mcp_tools.rs with
tests/mcp/.venv/bin/python.
"""

import asyncio
import json
import sys

import httpx2
import mcp_types as types
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


def dump(model):
    return model.model_dump(by_alias=True, mode="json", exclude_none=True)


def error_of(e):
    return {"error": {"code": e.code, "message": e.message, "data": e.data}}


async def connection(url, plan):
    out = {"initialize": None, "tools": None, "calls": []}
    # Headers go on the HTTP client, as the SDK documents; a run may take a
    # while, so reads wait as long as the SDK's own default.
    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(headers=plan.get("headers", {}), timeout=timeout) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                try:
                    out["initialize"] = dump(await session.initialize())
                except MCPError as e:
                    out.update(error_of(e))
                    return out
                out["tools"] = [dump(t) for t in (await session.list_tools()).tools]
                for call in plan.get("calls", []):
                    try:
                        result = await session.call_tool(
                            call["tool"], call.get("arguments"), meta=call.get("meta")
                        )
                        out["calls"].append({"result": dump(result)})
                    except MCPError as e:
                        out["calls"].append(error_of(e))
    return out


async def modern_connection(url, plan):
    out = {"tools": None, "calls": [], "elicitations": []}
    answers = list(plan.get("elicit") or [])

    async def on_elicit(context, params):
        asked = dump(params)
        out["elicitations"].append(asked)
        answer = answers.pop(0) if answers else {"action": "decline"}
        if "choose" in answer:
            options = asked["requestedSchema"]["properties"]["choice"]["oneOf"]
            chosen = next(o["const"] for o in options if o["title"] == answer["choose"])
            answer = {"action": "accept", "content": {"choice": chosen}}
        return types.ElicitResult(**answer)

    timeout = httpx2.Timeout(30, read=300)
    async with httpx2.AsyncClient(headers=plan.get("headers", {}), timeout=timeout) as http:
        transport = streamable_http_client(url, http_client=http)
        callback = on_elicit if plan.get("elicit") is not None else None
        async with Client(transport, mode=plan["mode"], elicitation_callback=callback, cache=None) as client:
            out["tools"] = [dump(t) for t in (await client.list_tools()).tools]
            for call in plan.get("calls", []):
                try:
                    result = await client.call_tool(call["tool"], call.get("arguments"), meta=call.get("meta"))
                    out["calls"].append({"result": dump(result)})
                except MCPError as e:
                    out["calls"].append(error_of(e))
    return out


async def main():
    plan = json.load(sys.stdin)
    results = []
    for c in plan["connections"]:
        if c.get("mode"):
            results.append(await modern_connection(plan["url"], c))
        else:
            results.append(await connection(plan["url"], c))
    json.dump({"connections": results}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
