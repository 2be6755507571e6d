"""List a Bindery tenant's exposed tools and call one, with the official MCP SDK.

    python pinned_tools.py URL TOKEN_FILE

URL is the tenant's endpoint (http://127.0.0.1:8080/mcp for a local
`bindery-sidecar serve`), TOKEN_FILE holds the MCP client token the
server was given (`--mcp-client-token-file`, or the tenant's
`mcpClientTokenSecretRef`). The call asks for another tenant's invoices;
the server's pinned tenant is the one the tool reads.
"""

import asyncio
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def main(url, token_file):
    with open(token_file) as f:
        headers = {"Authorization": "Bearer " + f.read().strip()}
    async with httpx2.AsyncClient(headers=headers) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = (await session.list_tools()).tools
                for tool in tools:
                    print(tool.name, sorted(tool.input_schema.get("properties", {})))
                result = await session.call_tool(
                    "bash_query-invoices", {"status": "overdue", "tenant_id": "globex"}
                )
                print(result.content[0].text, end="")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
