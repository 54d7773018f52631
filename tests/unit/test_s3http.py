"""Where the node's S3 client signs for and sends to, and how S3's answers read (no
sockets; the client against a real S3 server is tests/integration/test_s3http.py)."""

from __future__ import annotations

import pytest

from swarm.errors import AccessDeniedError, NotFoundError, SwarmError, UsageError
from swarm.s3http import (
    DEFAULT_REGION,
    S3Client,
    S3ResponseError,
    S3Url,
    _error_fields,
    endpoint_for,
    error_for,
    region_name,
)

AWS_VARS = (
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_CONFIG_FILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    for name in AWS_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))


def test_region_follows_botocores_order(monkeypatch, tmp_path):
    assert region_name() == DEFAULT_REGION
    (tmp_path / "config").write_text(
        "[default]\nregion = eu-west-1\n[profile other]\nregion = ap-south-1\n"
    )
    assert region_name() == "eu-west-1"
    monkeypatch.setenv("AWS_PROFILE", "other")
    assert region_name() == "ap-south-1"
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-west-2")
    assert region_name() == "us-west-2"
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert region_name() == "eu-central-1"


def test_endpoint_is_the_flag_then_the_environment_then_the_regions(monkeypatch):
    assert endpoint_for(None, "eu-west-1") == "https://s3.eu-west-1.amazonaws.com"
    assert endpoint_for(None, "cn-north-1") == "https://s3.cn-north-1.amazonaws.com.cn"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://10.0.0.5:9000/")
    assert endpoint_for(None, "eu-west-1") == "http://10.0.0.5:9000"
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://10.0.0.6:9000")
    assert endpoint_for(None, "eu-west-1") == "http://10.0.0.6:9000"
    assert endpoint_for("http://127.0.0.1:1", "eu-west-1") == "http://127.0.0.1:1"
    with pytest.raises(UsageError, match="not an http"):
        endpoint_for("s3.amazonaws.com", "eu-west-1")


def test_the_host_header_carries_a_port_only_when_it_is_not_the_schemes():
    assert S3Client("http://minio:9000").endpoint.host_header == "minio:9000"
    assert S3Client("https://s3.eu-west-1.amazonaws.com").endpoint.host_header == (
        "s3.eu-west-1.amazonaws.com"
    )
    assert S3Client("http://example.com:80").endpoint.host_header == "example.com"
    assert S3Client("http://[fd00::5]:9000").endpoint.host_header == "[fd00::5]:9000"


def test_a_proxy_from_the_environment_is_used_unless_the_host_is_exempt(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    aws = "https://s3.eu-west-1.amazonaws.com"
    assert S3Client(aws).endpoint.proxy == "http://proxy.internal:3128"
    assert S3Client("http://minio:9000").endpoint.proxy is None  # no HTTP_PROXY
    monkeypatch.setenv("NO_PROXY", "amazonaws.com")
    assert S3Client(aws).endpoint.proxy is None


def test_a_bucket_in_another_region_is_followed_there_on_aws_only(monkeypatch):
    """S3 answers a request to the wrong region with the bucket's (301 PermanentRedirect,
    or 400 AuthorizationHeaderMalformed, with x-amz-bucket-region); botocore followed."""
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    client = S3Client()
    moved = S3ResponseError(301, "PermanentRedirect", "", region="eu-west-1")
    assert client._moved("b", client.endpoint, moved)
    there = client._buckets["b"]
    assert there.url == "https://s3.eu-west-1.amazonaws.com" and there.region == "eu-west-1"
    assert not client._moved("b", there, moved)  # already there: a real error
    assert not client._moved("c", client.endpoint, S3ResponseError(403, "AccessDenied"))
    custom = S3Client("http://minio:9000")  # an endpoint given is where the bucket is
    assert not custom._moved("b", custom.endpoint, moved)


def test_s3_error_documents_give_code_and_message():
    xml = (
        '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
        "<Message>Please reduce your request rate.</Message><RequestId>1</RequestId></Error>"
    )
    assert _error_fields(xml) == ("SlowDown", "Please reduce your request rate.")
    assert _error_fields("") == ("", "")


def test_answers_become_errors_that_say_what_to_do():
    url = S3Url("b", "k")
    assert isinstance(error_for(404, "NoSuchKey", "", url, "read"), NotFoundError)
    assert "NoSuchBucket" in str(error_for(404, "NoSuchBucket", "", url, "read"))
    denied = error_for(403, "SignatureDoesNotMatch", "", url, "read")
    assert isinstance(denied, AccessDeniedError) and "s3:GetObject" in str(denied)
    assert "s3:PutObject" in str(error_for(403, "AccessDenied", "", url, "write"))
    other = error_for(500, "InternalError", "try again", url, "read")
    assert type(other) is SwarmError and "try again" in str(other)
