"""The SigV4 vectors sidecar/llm/src/credentials/aws/tests.rs checks Bindery's
signer against, computed once by botocore's own `SigV4Auth` (fixed keys, a
fixed time) and hardcoded there. Run it again to see them:

    tests/providers/.venv/bin/python tests/providers/sigv4_vector.py

Each vector is a Bedrock Converse request (POST, a JSON body, the model id's
`:` percent-encoded in the path as botocore's serializer writes it) signed
for service `bedrock`: with a session token (temporary credentials: the
token is a signed header) and without (long-term keys).
"""

import datetime
import json

import botocore.auth
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

# The moment every vector is signed at: 2024-01-02T03:04:05Z.
botocore.auth.get_current_datetime = lambda *a, **k: datetime.datetime(2024, 1, 2, 3, 4, 5)

KEY_ID = "AKIDEXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
TOKEN = "session-token-example/+="
URL = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-3-5-sonnet-20240620-v1%3A0/converse"
BODY = json.dumps({"messages": [{"role": "user", "content": [{"text": "hi"}]}]}, separators=(",", ":"))


def vector(token):
    request = AWSRequest(method="POST", url=URL, data=BODY.encode(),
                         headers={"content-type": "application/json", "accept": "application/json"})
    SigV4Auth(Credentials(KEY_ID, SECRET, token), "bedrock", "us-east-1").add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


if __name__ == "__main__":
    print(json.dumps({"url": URL, "body": BODY, "with_token": vector(TOKEN), "without_token": vector(None)}, indent=2))
