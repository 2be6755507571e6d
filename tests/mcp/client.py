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
Run by sidecar/tests/it/mcp_server.rs with tests/mcp/.venv/bin/python.
"""

import asyncio
import json
import sys

import httpx2
from mcp import ClientSession
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


async def main():
    plan = json.load(sys.stdin)
    results = []
    for c in plan["connections"]:
        results.append(await connection(plan["url"], c))
    json.dump({"connections": results}, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main())
