"""identity.py proven with botocore's own credential providers (and, for
Entra ID, the form azure-identity's WorkloadIdentityCredential posts: no
Azure SDK is among the pinned ones), then shown to refuse wrong requests.

    tests/providers/.venv/bin/python tests/providers/selftest_identity.py

Exits 0 and prints `N passed, 0 failed` when every check holds.
"""

import json
import os
import subprocess
import sys
import tempfile
import urllib.error
import urllib.parse
import urllib.request

import botocore.session
from botocore.credentials import (AssumeRoleWithWebIdentityProvider, ContainerProvider,
                                  CredentialRetrievalError)

HERE = os.path.dirname(os.path.abspath(__file__))
ROLE = "arn:aws:iam::111122223333:role/agent"
TENANT = "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"
CLIENT = "11111111-2222-3333-4444-555555555555"
JWT = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6YWdlbnRzOmFnZW50In0.c2ln"

passed, failed = 0, 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok   {what}")
    else:
        failed += 1
        print(f"FAIL {what} {detail}")


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def log_entries(log):
    with open(log) as f:
        return [json.loads(line) for line in f if line.strip()]


def post(url, form):
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, headers={"content-type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main():
    tmp = tempfile.mkdtemp(prefix="selftest-identity-")
    web_token, pod_token, fed_token = (os.path.join(tmp, n) for n in ("web", "pod", "fed"))
    write(web_token, JWT)
    write(pod_token, "pod-identity-token")
    write(fed_token, JWT)
    log = os.path.join(tmp, "log.jsonl")
    script = os.path.join(tmp, "script.json")
    write(script, json.dumps({"sts": [], "entra": [{"status": 503}]}))
    server = subprocess.Popen(
        [sys.executable, os.path.join(HERE, "identity.py"), "--log", log, "--script", script,
         "--web-identity-token-file", web_token, "--pod-token-file", pod_token,
         "--federated-token-file", fed_token, "--role-arn", ROLE, "--tenant", TENANT, "--client-id", CLIENT,
         "--access-key-id", "ASIASELFTEST", "--secret-access-key", "selftest-secret",
         "--session-token", "selftest-session"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        port = int(server.stdout.readline().split()[1])
        base = f"http://127.0.0.1:{port}"
        run(base, web_token, pod_token, log)
    finally:
        server.stdin.close()
        server.wait(timeout=10)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def run(base, web_token, pod_token, log):
    # ---- STS, with botocore's own web identity provider ----
    for k in list(os.environ):
        if k.startswith("AWS_"):
            del os.environ[k]
    os.environ.update({
        "AWS_ROLE_ARN": ROLE, "AWS_WEB_IDENTITY_TOKEN_FILE": web_token,
        "AWS_ROLE_SESSION_NAME": "selftest", "AWS_ENDPOINT_URL_STS": base,
        "AWS_REGION": "us-east-1", "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    })
    session = botocore.session.Session()
    provider = AssumeRoleWithWebIdentityProvider(
        load_config=lambda: session.full_config, client_creator=session.create_client,
        profile_name="default", cache={})
    creds = provider.load().get_frozen_credentials()
    check("botocore's web identity provider gets STS's credentials",
          (creds.access_key, creds.secret_key, creds.token) == ("ASIASELFTEST", "selftest-secret", "selftest-session"),
          str(creds))
    entry = log_entries(log)[-1]
    check("the STS request had no violation", entry["endpoint"] == "sts" and entry["token_ok"] and not entry["violations"],
          json.dumps(entry))
    check("the logged form hides the token", entry["form"].get("WebIdentityToken") == "<token>", json.dumps(entry))

    # And the same through botocore's whole default chain (env keys unset).
    creds = session.get_credentials().get_frozen_credentials()
    check("botocore's default chain reaches it", creds.access_key == "ASIASELFTEST", str(creds))

    # ---- STS refuses wrong requests ----
    good = {"Action": "AssumeRoleWithWebIdentity", "Version": "2011-06-15", "RoleArn": ROLE,
            "RoleSessionName": "selftest", "WebIdentityToken": JWT}
    status, body = post(base + "/", {**good, "Bogus": "x"})
    check("STS refuses a parameter the model does not know", status == 400 and "Unknown parameter" in body, body)
    status, body = post(base + "/", {k: v for k, v in good.items() if k != "RoleSessionName"})
    check("STS refuses a missing RoleSessionName", status == 400 and "RoleSessionName" in body, body)
    status, body = post(base + "/", {**good, "RoleSessionName": "has spaces"})
    check("STS refuses a session name off the pattern", status == 400 and "does not match" in body, body)
    status, body = post(base + "/", {**good, "WebIdentityToken": "another-token"})
    check("STS refuses a token not the file's", status == 400 and "InvalidIdentityToken" in body, body)
    status, body = post(base + "/", {**good, "Version": "2020-01-01"})
    check("STS refuses another API version", status == 400 and "Version" in body, body)
    # A rotated file is read anew.
    write(web_token, JWT + "rotated")
    status, body = post(base + "/", {**good, "WebIdentityToken": JWT + "rotated"})
    check("STS reads the token file at each request", status == 200 and "<SessionToken>" in body, body)
    write(web_token, JWT)

    # ---- EKS Pod Identity, with botocore's own container provider ----
    environ = {"AWS_CONTAINER_CREDENTIALS_FULL_URI": base + "/v1/credentials",
               "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": pod_token}
    creds = ContainerProvider(environ=environ).load().get_frozen_credentials()
    check("botocore's container provider gets the agent's credentials",
          (creds.access_key, creds.token) == ("ASIASELFTEST", "selftest-session"), str(creds))
    entry = log_entries(log)[-1]
    check("the Pod Identity request had the token", entry["endpoint"] == "pod" and entry["token_ok"], json.dumps(entry))
    wrong = pod_token + ".wrong"
    write(wrong, "not-the-token")
    try:
        ContainerProvider(environ={**environ, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": wrong}).load()
        check("the agent refuses another token", False, "it answered")
    except CredentialRetrievalError as e:
        check("the agent refuses another token", "401" in str(e), str(e))

    # ---- Entra ID: the form WorkloadIdentityCredential posts ----
    url = f"{base}/{TENANT}/oauth2/v2.0/token"
    form = {"client_id": CLIENT, "grant_type": "client_credentials",
            "client_assertion_type": "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            "client_assertion": JWT, "scope": "https://cognitiveservices.azure.com/.default",
            "client_info": "1"}
    status, body = post(url, form)
    check("a scripted Entra failure is Entra's shape",
          status == 503 and json.loads(body)["error"] == "temporarily_unavailable", body)
    status, body = post(url, form)
    reply = json.loads(body) if status == 200 else {}
    check("Entra gives a Bearer token", status == 200 and reply.get("token_type") == "Bearer"
          and reply.get("access_token") and isinstance(reply.get("expires_in"), int), body)
    status, body = post(url, {**form, "client_assertion": "another"})
    check("Entra refuses an assertion not the file's", status == 400 and "AADSTS70021" in body, body)
    status, body = post(url, {**form, "resource": "https://x"})
    check("Entra refuses a key the grant does not take", status == 400 and "resource" in body, body)
    status, body = post(url, {**form, "scope": "https://graph.microsoft.com/.default"})
    check("Entra refuses another scope", status == 400 and "scope" in body, body)
    status, body = post(f"{base}/other-tenant/oauth2/v2.0/token", form)
    check("Entra refuses another tenant", status == 400 and "tenant" in body, body)
    entries = [e for e in log_entries(log) if e["endpoint"] == "entra"]
    check("the logged form hides the assertion", all(e["form"].get("client_assertion") == "<token>" for e in entries))


if __name__ == "__main__":
    main()
