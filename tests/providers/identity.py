"""The cloud identity endpoints a model client gets its credentials from,
played on loopback, each checking what it is sent: AWS STS
(AssumeRoleWithWebIdentity, for IRSA), the EKS Pod Identity agent, and
Entra ID's token endpoint (AKS workload identity).

    identity.py --log LOG.jsonl [--web-identity-token-file F]
        [--pod-token-file F] [--federated-token-file F]
        [--role-arn ARN] [--tenant T] [--client-id C]
        [--access-key-id K --secret-access-key S --session-token T]
        [--access-token A] [--ttl SECONDS] [--script SCRIPT.json]

Endpoints (point the pod's variables at them):
  POST /                               STS: AWS_ENDPOINT_URL_STS=http://127.0.0.1:PORT
  GET  /v1/credentials                 Pod Identity: AWS_CONTAINER_CREDENTIALS_FULL_URI=http://127.0.0.1:PORT/v1/credentials
  POST /{tenant}/oauth2/v2.0/token     Entra ID: AZURE_AUTHORITY_HOST=http://127.0.0.1:PORT/

- STS validates the form with botocore's own sts service model (the
  `AssumeRoleWithWebIdentityRequest` shape, a key it does not know refused),
  then what the model's validator leaves out (max lengths, the session
  name's pattern, Action and Version) and that WebIdentityToken is the
  token file's content (read at each request: rotate it by rewriting the
  file); it answers STS's XML, checked with botocore's own query parser
  against the operation's output shape before it is sent, and errors as
  STS's <ErrorResponse>.
- Pod Identity checks that Authorization is the token file's content and
  answers the container credentials JSON botocore's ContainerProvider reads.
- Entra ID checks the form (grant_type, client_id, scope,
  client_assertion_type, client_assertion the federated token file's
  content, no other key but MSAL's client_info) and answers
  {token_type, expires_in, ext_expires_in, access_token}; errors are
  Entra's {error, error_description "AADSTS…", error_codes, …}.

Credentials issued are --access-key-id/--secret-access-key/--session-token
(the Bedrock mock's key, for an end-to-end test) valid --ttl seconds.
SCRIPT.json (optional) scripts failures per endpoint, consumed in order
before the default success:
  {"sts": [{"status": 403, "code": "AccessDenied", "message": "..."}],
   "pod": [{"status": 500, "message": "..."}],
   "entra": [{"status": 400, "code": "AADSTS70021", "message": "..."}],
   and a step {"ttl": 60} issues credentials of that lifetime}
Each request is appended to LOG.jsonl as {"endpoint", "method", "path",
"token_ok", "form" (secrets replaced by "<token>"), "violations"}; a
request with violations is answered 400 in the endpoint's own shape. The
port is printed as `PORT <n>`; the server stops when its stdin closes.
"""

import argparse
import datetime
import json
import re
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit
from xml.sax.saxutils import escape

import botocore.session
from botocore.parsers import QueryParser
from botocore.validate import ParamValidator

STS_MODEL = botocore.session.get_session().get_service_model("sts")
ASSUME = STS_MODEL.operation_model("AssumeRoleWithWebIdentity")
STS_NS = STS_MODEL.metadata["xmlNamespace"]
JWT_BEARER = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
SCOPE = "https://cognitiveservices.azure.com/.default"
ENTRA_KEYS = {"client_id", "scope", "grant_type", "client_assertion_type", "client_assertion"}


def read_token(path):
    """The token in `path` now (it may have been rotated), whitespace out."""
    if path is None:
        return None
    with open(path) as f:
        return f.read().strip()


def iso(t):
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def sts_params(form, violations):
    """The form as the operation's parameters, checked with botocore's model."""
    params = {}
    for key, value in form.items():
        if key in ("Action", "Version"):
            continue
        shape = ASSUME.input_shape.members.get(key)
        if shape is not None and shape.type_name == "integer":
            try:
                value = int(value)
            except ValueError:
                violations.append(f"{key} is not an integer")
                continue
        params[key] = value
    report = ParamValidator().validate(params, ASSUME.input_shape)
    if report.has_errors():
        violations.append(f"botocore's AssumeRoleWithWebIdentityRequest refuses it: {report.generate_report()}")
    # What botocore's validator leaves to the service: max lengths, patterns.
    for key, value in params.items():
        shape = ASSUME.input_shape.members.get(key)
        if shape is None or not isinstance(value, str):
            continue
        top = shape.metadata.get("max")
        if top is not None and len(value) > top:
            violations.append(f"{key} is longer than {top}")
        pattern = shape.metadata.get("pattern")
        if key == "RoleSessionName" and pattern and not re.fullmatch(pattern, value):
            violations.append(f"RoleSessionName does not match {pattern}")
    if form.get("Action") != "AssumeRoleWithWebIdentity":
        violations.append(f"Action {form.get('Action')!r}, not AssumeRoleWithWebIdentity")
    if form.get("Version") != STS_MODEL.api_version:
        violations.append(f"Version {form.get('Version')!r}, not {STS_MODEL.api_version}")
    return params


def sts_reply_xml(args, params, ttl):
    expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=ttl)
    session = escape(params.get("RoleSessionName", "s"))
    role = params.get("RoleArn", "arn:aws:iam::111122223333:role/r")
    account = role.split(":")[4] if role.count(":") >= 5 else "111122223333"
    name = role.rsplit("/", 1)[-1]
    xml = f"""<AssumeRoleWithWebIdentityResponse xmlns="{STS_NS}">
  <AssumeRoleWithWebIdentityResult>
    <SubjectFromWebIdentityToken>system:serviceaccount:agents:agent</SubjectFromWebIdentityToken>
    <Audience>sts.amazonaws.com</Audience>
    <AssumedRoleUser>
      <Arn>arn:aws:sts::{escape(account)}:assumed-role/{escape(name)}/{session}</Arn>
      <AssumedRoleId>AROA3XFRBF535PLBIFPI4:{session}</AssumedRoleId>
    </AssumedRoleUser>
    <Credentials>
      <AccessKeyId>{escape(args.access_key_id)}</AccessKeyId>
      <SecretAccessKey>{escape(args.secret_access_key)}</SecretAccessKey>
      <SessionToken>{escape(args.session_token)}</SessionToken>
      <Expiration>{iso(expires)}</Expiration>
    </Credentials>
    <Provider>arn:aws:iam::{escape(account)}:oidc-provider/oidc.eks.us-east-1.amazonaws.com/id/EXAMPLE</Provider>
  </AssumeRoleWithWebIdentityResult>
  <ResponseMetadata>
    <RequestId>{uuid.uuid4()}</RequestId>
  </ResponseMetadata>
</AssumeRoleWithWebIdentityResponse>"""
    # The answer is what botocore reads as the operation's output, or this
    # mock is wrong.
    parsed = QueryParser().parse({"body": xml.encode(), "headers": {}, "status_code": 200}, ASSUME.output_shape)
    assert parsed["Credentials"]["AccessKeyId"] == args.access_key_id, parsed
    return xml


def sts_error_xml(code, message, sender=True):
    return f"""<ErrorResponse xmlns="{STS_NS}">
  <Error>
    <Type>{"Sender" if sender else "Receiver"}</Type>
    <Code>{escape(code)}</Code>
    <Message>{escape(message)}</Message>
  </Error>
  <RequestId>{uuid.uuid4()}</RequestId>
</ErrorResponse>"""


# The OAuth error Entra ID gives with each AADSTS code used here.
ENTRA_ERRORS = {"AADSTS70021": "invalid_client", "AADSTS700024": "invalid_client",
                "AADSTS700016": "unauthorized_client", "AADSTS90002": "invalid_request",
                "AADSTS900144": "invalid_request"}


def entra_error(status, code, message):
    error = ENTRA_ERRORS.get(code, "temporarily_unavailable" if status >= 500 else "invalid_request")
    number = int(code[6:]) if code.startswith("AADSTS") and code[6:].isdigit() else 0
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")
    return {
        "error": error,
        "error_description": f"{code}: {message} Trace ID: {uuid.uuid4()} Correlation ID: {uuid.uuid4()} Timestamp: {now}",
        "error_codes": [number],
        "timestamp": now,
        "trace_id": str(uuid.uuid4()),
        "correlation_id": str(uuid.uuid4()),
        "error_uri": "https://login.microsoftonline.com/error?code=%d" % number,
    }


class Identity:
    def __init__(self, args):
        self.args = args
        self.log = open(args.log, "a")
        self.lock = threading.Lock()
        self.script = json.load(open(args.script)) if args.script else {}

    def step(self, endpoint):
        """The next scripted step of `endpoint`, or None for the default."""
        with self.lock:
            steps = self.script.get(endpoint) or []
            return steps.pop(0) if steps else None

    def record(self, entry):
        with self.lock:
            self.log.write(json.dumps(entry) + "\n")
            self.log.flush()


def handler(identity):
    args = identity.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send(self, status, content_type, body, headers=()):
            data = body.encode()
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(data)))
            for k, v in headers:
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

        def form(self, violations):
            raw = self.rfile.read(int(self.headers.get("content-length", 0)))
            kind = (self.headers.get("content-type") or "").split(";")[0].strip().lower()
            if kind != "application/x-www-form-urlencoded":
                violations.append(f"content-type {self.headers.get('content-type')!r}, not a form")
            try:
                pairs = parse_qsl(raw.decode(), keep_blank_values=True, strict_parsing=bool(raw))
            except (ValueError, UnicodeDecodeError) as e:
                violations.append(f"the body is not a form: {e}")
                return {}
            form = {}
            for k, v in pairs:
                if k in form:
                    violations.append(f"{k} is given twice")
                form[k] = v
            return form

        def logged(self, endpoint, token_ok, form, violations, secret_keys=()):
            shown = {k: ("<token>" if k in secret_keys else v) for k, v in form.items()}
            identity.record({"endpoint": endpoint, "method": self.command, "path": self.path,
                             "token_ok": token_ok, "form": shown, "violations": violations})

        def do_POST(self):
            path = urlsplit(self.path).path
            if path in ("/", "/sts", "/sts/"):
                return self.sts()
            m = re.fullmatch(r"/([A-Za-z0-9.-]+)/oauth2/v2\.0/token", path)
            if m:
                return self.entra(m.group(1))
            self.send(404, "application/json", json.dumps({"message": f"no endpoint at POST {path}"}))

        def do_GET(self):
            if urlsplit(self.path).path == "/v1/credentials":
                return self.pod()
            self.send(404, "application/json", json.dumps({"message": f"no endpoint at GET {self.path}"}))

        def sts(self):
            violations = []
            form = self.form(violations)
            params = sts_params(form, violations)
            if self.headers.get("authorization") is not None:
                violations.append("an Authorization header: AssumeRoleWithWebIdentity is not signed")
            expected = read_token(args.web_identity_token_file)
            token_ok = expected is not None and form.get("WebIdentityToken") == expected
            if args.role_arn and form.get("RoleArn") != args.role_arn:
                violations.append(f"RoleArn {form.get('RoleArn')!r}, not {args.role_arn!r}")
            self.logged("sts", token_ok, form, violations, ("WebIdentityToken",))
            if violations:
                return self.send(400, "text/xml", sts_error_xml("ValidationError", "; ".join(violations)))
            if not token_ok:
                return self.send(400, "text/xml", sts_error_xml(
                    "InvalidIdentityToken", "The web identity token is not the one expected (the token file's)"))
            step = identity.step("sts") or {}
            if "status" in step:
                headers = [("retry-after", str(step["retry_after"]))] if "retry_after" in step else []
                return self.send(step["status"], "text/xml", sts_error_xml(
                    step.get("code", "AccessDenied"), step.get("message", "scripted"), step["status"] < 500), headers)
            self.send(200, "text/xml", sts_reply_xml(args, params, step.get("ttl", args.ttl)))

        def pod(self):
            violations = []
            expected = read_token(args.pod_token_file)
            token_ok = expected is not None and self.headers.get("authorization") == expected
            self.logged("pod", token_ok, {}, violations)
            if not token_ok:
                return self.send(401, "application/json", json.dumps(
                    {"code": "AccessDeniedException", "message": "the authorization token is not the one expected"}))
            step = identity.step("pod") or {}
            if "status" in step:
                return self.send(step["status"], "application/json", json.dumps(
                    {"code": step.get("code", "InternalError"), "message": step.get("message", "scripted")}))
            expires = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=step.get("ttl", args.ttl))
            self.send(200, "application/json", json.dumps({
                "AccessKeyId": args.access_key_id,
                "SecretAccessKey": args.secret_access_key,
                "Token": args.session_token,
                "AccountId": "111122223333",
                "Expiration": iso(expires),
            }))

        def entra(self, tenant):
            violations = []
            form = self.form(violations)
            for key in sorted(set(form) - ENTRA_KEYS - {"client_info"}):
                violations.append(f"the form has {key}, which the client credentials grant does not take")
            for key in sorted(ENTRA_KEYS - set(form)):
                violations.append(f"the form has no {key}")
            for key, want in (("grant_type", "client_credentials"), ("scope", SCOPE),
                              ("client_assertion_type", JWT_BEARER)):
                if key in form and form[key] != want:
                    violations.append(f"{key} {form[key]!r}, not {want!r}")
            if args.client_id and form.get("client_id") != args.client_id:
                violations.append(f"client_id {form.get('client_id')!r}, not {args.client_id!r}")
            if args.tenant and tenant != args.tenant:
                violations.append(f"tenant {tenant!r}, not {args.tenant!r}")
            expected = read_token(args.federated_token_file)
            token_ok = expected is not None and form.get("client_assertion") == expected
            self.logged("entra", token_ok, form, violations, ("client_assertion",))
            if violations:
                return self.send(400, "application/json", json.dumps(
                    entra_error(400, "AADSTS900144", "; ".join(violations))))
            if not token_ok:
                return self.send(400, "application/json", json.dumps(entra_error(
                    400, "AADSTS70021", "No matching federated identity record found for presented assertion.")))
            step = identity.step("entra") or {}
            if "status" in step:
                headers = [("retry-after", str(step["retry_after"]))] if "retry_after" in step else []
                return self.send(step["status"], "application/json", json.dumps(entra_error(
                    step["status"], step.get("code", "AADSTS70021" if step["status"] < 500 else "AADSTS50000"),
                    step.get("message", "scripted"))), headers)
            ttl = step.get("ttl", args.ttl)
            self.send(200, "application/json", json.dumps({
                "token_type": "Bearer", "expires_in": ttl, "ext_expires_in": ttl,
                "access_token": args.access_token}))

    return Handler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--log", required=True)
    p.add_argument("--script")
    p.add_argument("--web-identity-token-file")
    p.add_argument("--pod-token-file")
    p.add_argument("--federated-token-file")
    p.add_argument("--role-arn")
    p.add_argument("--tenant")
    p.add_argument("--client-id")
    p.add_argument("--access-key-id", default="ASIAIDENTITYMOCK")
    p.add_argument("--secret-access-key", default="identity-mock-secret")
    p.add_argument("--session-token", default="identity-mock-session-token")
    p.add_argument("--access-token", default="identity-mock-access-token")
    p.add_argument("--ttl", type=int, default=3600)
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler(Identity(args)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    print(f"PORT {server.server_address[1]}", flush=True)
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
