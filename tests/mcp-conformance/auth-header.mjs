// Preloaded by run-server.sh (node --import): the conformance suite has no
// option for request headers, and Bindery's /mcp wants a bearer token. With
// MCP_BEARER_TOKEN set, every request the suite makes to MCP_CONFORMANCE_URL's
// origin carries `Authorization: Bearer $MCP_BEARER_TOKEN`, unless it sets
// one itself. Both ways the suite sends (Node's fetch, undici's request) go
// through undici's global dispatcher, so that is where it is added.
import { Agent, setGlobalDispatcher } from 'undici';

const token = process.env.MCP_BEARER_TOKEN;

// A dispatch's headers (an object, a flat [name, value, …] list or an iterable
// of [name, value] pairs), as a flat list with the Authorization header added.
function withAuth(headers) {
  const pairs = headers == null ? []
    : Array.isArray(headers) && typeof headers[0] === 'string' ? headers.flatMap((h, i) => (i % 2 ? [] : [[h, headers[i + 1]]]))
    : Symbol.iterator in headers ? [...headers] : Object.entries(headers);
  return pairs.some(([name]) => name.toLowerCase() === 'authorization')
    ? headers : [...pairs, ['authorization', `Bearer ${token}`]].flat(1);
}

if (token) {
  const origin = new URL(process.env.MCP_CONFORMANCE_URL).origin;
  setGlobalDispatcher(new Agent().compose((dispatch) => (opts, handler) =>
    dispatch(new URL(opts.origin).origin === origin ? { ...opts, headers: withAuth(opts.headers) } : opts, handler)));
}
