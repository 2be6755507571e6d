"""A protected MCP server for the tests: the official MCP Python SDK as an
OAuth 2.1 resource server (protected-resource metadata, bearer tokens, the
401 and 403 challenges all the SDK's own), trusting the tokens of one real
authorization server (Keycloak in the tests), checked with PyJWT against the
issuer's published keys.

    protected_server.py ISSUER AUDIENCE SCOPE

It listens on a free port of 127.0.0.1, prints its MCP endpoint's URL on
stdout once it is listening, and serves until killed. Its one tool,
`whoami`, answers who the token it was called with was issued to and for:
the client (`azp`), the subject (`sub`), the preferred username and the
scopes, never the token.
"""

import asyncio
import json
import socket
import sys

import jwt
import uvicorn
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer


def main() -> None:
    issuer, audience, scope = sys.argv[1:4]
    keys = jwt.PyJWKClient(f"{issuer}/protocol/openid-connect/certs", cache_keys=True)

    class Verifier:
        """A token this server takes: signed by the issuer's key, for this
        audience, unexpired. The scope is the SDK's to check."""

        async def verify_token(self, token: str) -> AccessToken | None:
            try:
                key = await asyncio.to_thread(keys.get_signing_key_from_jwt, token)
                claims = jwt.decode(
                    token,
                    key.key,
                    algorithms=["RS256", "ES256"],
                    audience=audience,
                    issuer=issuer,
                )
            except jwt.PyJWTError as e:
                print(f"refused a token: {type(e).__name__}", file=sys.stderr, flush=True)
                return None
            return AccessToken(
                token=token,
                client_id=claims.get("azp", ""),
                scopes=claims.get("scope", "").split(),
                expires_at=claims.get("exp"),
                subject=claims.get("sub"),
                claims=claims,
            )

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/mcp"

    server = MCPServer(
        name="protected",
        token_verifier=Verifier(),
        auth=AuthSettings(
            issuer_url=issuer,
            resource_server_url=url,
            required_scopes=[scope],
            # The verifier checks the audience itself.
            validate_token_resource=False,
        ),
    )

    @server.tool()
    def whoami() -> str:
        """Says whom the call's token was issued to."""
        token = get_access_token()
        claims = (token.claims or {}) if token else {}
        return json.dumps(
            {
                "client": token.client_id if token else None,
                "sub": token.subject if token else None,
                "user": claims.get("preferred_username"),
                "scopes": sorted(token.scopes) if token else [],
            },
            sort_keys=True,
        )

    app = server.streamable_http_app()
    config = uvicorn.Config(app, log_level="warning", lifespan="on")
    print(url, flush=True)
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
