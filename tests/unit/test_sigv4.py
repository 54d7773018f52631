"""swarm.sigv4 signs as awscrt (the AWS SDKs' common runtime) does, request by request."""

from __future__ import annotations

import datetime

import awscrt.auth
import awscrt.http
import pytest

from swarm import sigv4

NOW = datetime.datetime(2026, 11, 26, 22, 40, 5, tzinfo=datetime.UTC)


def awscrt_signed(
    method: str, path: str, headers: list[tuple[str, str]], creds: sigv4.Credentials, region: str
) -> dict[str, str]:
    config = awscrt.auth.AwsSigningConfig(
        credentials_provider=awscrt.auth.AwsCredentialsProvider.new_static(
            creds.access_key_id, creds.secret_access_key, creds.session_token
        ),
        region=region,
        service="s3",
        date=NOW,
        use_double_uri_encode=False,
        should_normalize_uri_path=False,
        signed_body_value=awscrt.auth.AwsSignedBodyValue.EMPTY_SHA256,
        signed_body_header_type=awscrt.auth.AwsSignedBodyHeaderType.X_AMZ_CONTENT_SHA_256,
    )
    request = awscrt.http.HttpRequest(method, path, awscrt.http.HttpHeaders(headers))
    return dict(awscrt.auth.aws_sign_request(request, config).result().headers)


@pytest.mark.parametrize(
    ("path", "extra", "token", "region"),
    [
        ("/bucket/index.db", [], None, "us-east-1"),
        ("/bucket/cat/a%20b%2Bc/~x_y-z.swarm", [("Range", "bytes=0-4194303")], None, "eu-west-3"),
        (
            "/prefix/bucket/k%C3%A9y",
            [("Range", "bytes=5-9")],
            "FwoGZXIvYXdzE//token+=",
            "us-west-2",
        ),
        ("/bucket/key?versionId=3%2Fx&partNumber=2", [], None, "us-east-1"),
    ],
)
def test_signature_is_awscrt_s(path, extra, token, region):
    creds = sigv4.Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    headers = [("Host", "s3.example.internal:9000"), *extra]
    ours = dict(sigv4.sign("GET", path, headers, creds, region, NOW))
    theirs = awscrt_signed("GET", path, headers, creds, region)
    assert ours["Authorization"] == theirs["Authorization"]
    assert {k.lower(): v for k, v in ours.items()} == {k.lower(): v for k, v in theirs.items()}


def test_a_naive_local_time_is_not_taken_for_utc():
    creds = sigv4.Credentials("AKID", "secret")
    local = NOW.astimezone(datetime.timezone(datetime.timedelta(hours=9)))
    assert sigv4.sign("GET", "/b/k", [("Host", "h")], creds, "us-east-1", local) == sigv4.sign(
        "GET", "/b/k", [("Host", "h")], creds, "us-east-1", NOW
    )
