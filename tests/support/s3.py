"""A real S3-compatible server for tests: moto's server mode on 127.0.0.1, on a free port.

`MotoS3` starts `moto.server.ThreadedMotoServer` (the real HTTP server moto ships, speaking
the S3 REST protocol that boto3 speaks to AWS) in this process, creates a bucket and hands out
plain boto3 clients and the TENURE_* settings that point a Tenure process at it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto.server import ThreadedMotoServer

from services.common.objectstore.s3 import s3_client

__all__ = ["BUCKET", "MotoS3", "moto_s3"]

BUCKET = "tenure-artifacts"
# moto accepts any credentials; these are the placeholders moto's own docs use.
ACCESS_KEY = "testing"
SECRET_KEY = "testing-secret"
REGION = "us-east-1"


class MotoS3:
    def __init__(self) -> None:
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint_url = ""

    def start(self) -> MotoS3:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint_url = f"http://{host}:{port}"
        self.plain_client().create_bucket(Bucket=BUCKET)
        return self

    def stop(self) -> None:
        self._server.stop()

    def plain_client(self) -> Any:
        """A boto3 client as any S3 user would make one: not Tenure's."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=REGION,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
        )

    def tenure_client(self, *, timeout_s: float = 5.0, max_attempts: int = 3) -> Any:
        """The client Tenure's own factory makes (services.common.objectstore.s3.s3_client)."""
        return s3_client(
            endpoint_url=self.endpoint_url,
            region=REGION,
            access_key_id=ACCESS_KEY,
            secret_access_key=SECRET_KEY,
            timeout_s=timeout_s,
            max_attempts=max_attempts,
        )

    def tenure_env(self, prefix: str = "") -> dict[str, str]:
        """TENURE_* settings that select this server as a process's object store."""
        return {
            "TENURE_OBJECT_STORE": "s3",
            "TENURE_S3_BUCKET": BUCKET,
            "TENURE_S3_ENDPOINT_URL": self.endpoint_url,
            "TENURE_S3_REGION": REGION,
            "TENURE_S3_ACCESS_KEY_ID": ACCESS_KEY,
            "TENURE_S3_SECRET_ACCESS_KEY": SECRET_KEY,
            "TENURE_S3_KEY_PREFIX": prefix,
            "TENURE_S3_TIMEOUT_S": "2",
        }

    def names(self, prefix: str) -> list[str]:
        """Every object name under `prefix`, sorted."""
        names: list[str] = []
        pages = self.plain_client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        for page in pages:
            names.extend(item["Key"] for item in page.get("Contents", []))
        return sorted(names)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3().start()
    yield server
    server.stop()
