"""A stand-in for the EC2 instance metadata service, IMDSv2 only (token first).

Run inside a test host's namespace, bound to 169.254.169.254:80 on that namespace's
loopback: ``python imds_standin.py REGION INSTANCE_ID LOCAL_IP``. GETs without a valid
token get 401, as on EC2 with IMDSv2 required. With ``AWS_ACCESS_KEY_ID`` and
``AWS_SECRET_ACCESS_KEY`` in its environment it also serves them as the credentials of an
instance profile (role ``swarm-node``), in the form botocore and the user-data read.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

REGION, INSTANCE_ID, LOCAL_IP = sys.argv[1:4]
TOKENS: set[str] = set()
METADATA = {
    "/latest/meta-data/placement/region": REGION,
    "/latest/meta-data/instance-id": INSTANCE_ID,
    "/latest/meta-data/local-ipv4": LOCAL_IP,
}
ROLE = "swarm-node"
if os.environ.get("AWS_ACCESS_KEY_ID"):
    now = datetime.now(UTC)
    METADATA["/latest/meta-data/iam/security-credentials/"] = ROLE
    METADATA[f"/latest/meta-data/iam/security-credentials/{ROLE}"] = json.dumps(
        {
            "Code": "Success",
            "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "Type": "AWS-HMAC",
            "AccessKeyId": os.environ["AWS_ACCESS_KEY_ID"],
            "SecretAccessKey": os.environ["AWS_SECRET_ACCESS_KEY"],
            "Token": "stand-in-session-token",
            "Expiration": (now + timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
    )


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def reply(self, status: int, body: str) -> None:
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        if self.path != "/latest/api/token" or not self.headers.get(
            "X-aws-ec2-metadata-token-ttl-seconds"
        ):
            self.reply(400, "bad token request")
            return
        token = secrets.token_hex(16)
        TOKENS.add(token)
        self.reply(200, token)

    def do_GET(self) -> None:
        if self.headers.get("X-aws-ec2-metadata-token") not in TOKENS:
            self.reply(401, "IMDSv2 token required")
            return
        value = METADATA.get(self.path)
        self.reply(200, value) if value is not None else self.reply(404, "not found")


ThreadingHTTPServer(("169.254.169.254", 80), Handler).serve_forever()
