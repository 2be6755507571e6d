// Maps a conformance client scenario to an agent file with an MCP toolbox,
// runs bindery-sidecar on it, and plays the person of an authorization-code
// grant (see run-client.sh). Node 22, no packages.
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const url = process.argv[process.argv.length - 1];
const scenario = process.env.MCP_CONFORMANCE_SCENARIO ?? "";
const context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT ?? "{}");

// The tool each scenario's server offers, and its arguments; none: only
// initialize and list.
const tools = {
  tools_call: ["add_numbers", { a: 2, b: 3 }],
  "sse-retry": ["test_reconnection", {}],
};
const [tool, args] = scenario.startsWith("auth/") ? ["test-tool", {}] : (tools[scenario] ?? []);

const parameters = [];
const env = { ...process.env };
const secret = (name, value) => {
  parameters.push({ name, secret: true, scope: "process", default: { env: name.toUpperCase() } });
  env[name.toUpperCase()] = value;
  return { param: name };
};

let oauth;
if (scenario.startsWith("auth/client-credentials-")) {
  oauth = { grant: "client-credentials", clientId: { literal: context.client_id } };
  if (context.private_key_pem) {
    oauth.privateKey = secret("private_key", context.private_key_pem);
    if (context.signing_algorithm) oauth.signingAlgorithm = context.signing_algorithm;
  } else {
    oauth.clientSecret = secret("client_secret", context.client_secret);
  }
} else if (scenario.startsWith("auth/")) {
  oauth = { grant: "authorization-code" };
  if (context.client_id) oauth.clientId = { literal: context.client_id };
  if (context.client_secret) oauth.clientSecret = secret("client_secret", context.client_secret);
  // This client's metadata document, for servers that take one as its id.
  if (scenario === "auth/basic-cimd") {
    oauth.clientMetadataUrl = "https://conformance-test.local/client-metadata.json";
  }
}

// A client with a credential sends it only to an authorization server the
// agent file trusts (`oauth.issuer`) when it is on another origin than the
// MCP server, as the suite's is: the operator's part, played here by
// reading the server's protected-resource metadata.
if (oauth && (oauth.clientSecret || oauth.privateKey)) {
  const u = new URL(url);
  const path = u.pathname.replace(/\/$/, "");
  for (const where of [`/.well-known/oauth-protected-resource${path}`, "/.well-known/oauth-protected-resource"]) {
    const r = await fetch(new URL(where, u.origin)).catch(() => null);
    if (r?.ok) {
      const issuer = (await r.json()).authorization_servers?.[0];
      if (issuer) oauth.issuer = issuer;
      break;
    }
  }
}

const agent = {
  apiVersion: "bindery.dev/v1alpha1",
  kind: "Agent",
  metadata: { name: "conformance" },
  spec: {
    model: { url: "http://127.0.0.1:9/v1", name: "none" },
    systemPrompt: "The conformance suite's client.",
    parameters,
    toolboxes: [{ mcp: { name: "conf", url, ...(oauth ? { oauth } : {}) } }],
  },
};
const dir = mkdtempSync(join(tmpdir(), "bindery-conformance-"));
const file = join(dir, "agent.json");
writeFileSync(file, JSON.stringify(agent, null, 2));

const argv = tool
  ? ["tool-call", "--agent-file", file, "--tool", `mcp_conf_${tool}`, "--args", JSON.stringify(args)]
  : ["describe", "--agent-file", file];
const child = spawn(process.env.BINDERY_SIDECAR, argv, { env, stdio: ["pipe", "inherit", "pipe"] });

// The person: the line after the consent prompt is the authorization URL;
// the suite's authorization server redirects at once.
let pending = "";
let prompted = false;
child.stderr.on("data", (chunk) => {
  process.stderr.write(chunk);
  pending += chunk.toString();
  let nl;
  while ((nl = pending.indexOf("\n")) >= 0) {
    const line = pending.slice(0, nl);
    pending = pending.slice(nl + 1);
    if (line.includes("needs your consent")) {
      prompted = true;
    } else if (prompted && line.startsWith("  http")) {
      prompted = false;
      consent(line.trim());
    }
  }
});

async function consent(authorizationUrl) {
  try {
    const answer = await fetch(authorizationUrl, { redirect: "manual" });
    const location = answer.headers.get("location");
    if (!location) throw new Error(`the authorization endpoint answered ${answer.status} without a redirect`);
    child.stdin.write(new URL(location, authorizationUrl).toString() + "\n");
  } catch (e) {
    process.stderr.write(`client.mjs: ${e}\n`);
    child.stdin.end();
  }
}

child.on("exit", (code, signal) => {
  rmSync(dir, { recursive: true, force: true });
  process.exit(code ?? (signal ? 1 : 0));
});
