"""The object store a deployment configured (TenureSettings: TENURE_OBJECT_STORE and TENURE_S3_*)."""

from __future__ import annotations

from pathlib import Path

from services.common.objectstore._filesystem import FilesystemObjectStore
from services.common.objectstore._store import ObjectStore
from services.common.settings import TenureSettings

__all__ = ["open_object_store"]


def open_object_store(settings: TenureSettings, default_root: Path) -> ObjectStore:
    """The filesystem store under `default_root` (the default), or the S3 store.

    Opening the S3 store sends nothing: a bucket that is down at start-up is an outage of the
    requests that need it (503), not a process that fails to start."""
    if settings.object_store == "filesystem":
        return FilesystemObjectStore(default_root)
    # Imported here: boto3 costs start-up time every process would pay for the default store.
    from services.common.objectstore.s3 import S3ObjectStore, s3_client

    client = s3_client(
        endpoint_url=settings.s3_endpoint_url,
        region=settings.s3_region,
        access_key_id=settings.s3_access_key_id,
        secret_access_key=settings.s3_secret_access_key.get_secret_value(),
        session_token=settings.s3_session_token.get_secret_value(),
        addressing_style=settings.s3_addressing_style,
        timeout_s=settings.s3_timeout_s,
        max_attempts=settings.s3_max_attempts,
    )
    return S3ObjectStore(client, settings.s3_bucket, settings.s3_key_prefix)
