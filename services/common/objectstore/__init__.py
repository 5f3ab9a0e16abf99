"""The artifact object store (EXE-15): content-addressed, immutable keys, verifiable manifests.

`FilesystemObjectStore` is the default implementation, `S3ObjectStore` (services.common.objectstore.s3,
imported on demand: it brings boto3) keeps the same layout in an S3 bucket, and
`MemoryObjectStore` is their twin for unit tests; all honour the `ObjectStore` contract
(tests/contract/test_objectstore_contract.py). `open_object_store` opens the configured one.
The service calls `verify` with a ResultManifest's entries before accepting terminal success.
"""

from services.common.objectstore._factory import open_object_store
from services.common.objectstore._filesystem import FilesystemObjectStore
from services.common.objectstore._memory import MemoryObjectStore
from services.common.objectstore._store import (
    MAX_KEY_CHARS,
    CorruptKeyRecord,
    CorruptObject,
    InvalidKey,
    InvalidMediaType,
    KeyExists,
    ManifestEntry,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectStoreUnavailable,
    ObjectTooLarge,
    StoredObject,
    validate_key,
)

__all__ = [
    "MAX_KEY_CHARS",
    "CorruptKeyRecord",
    "CorruptObject",
    "FilesystemObjectStore",
    "InvalidKey",
    "InvalidMediaType",
    "KeyExists",
    "ManifestEntry",
    "MemoryObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectStoreUnavailable",
    "ObjectTooLarge",
    "StoredObject",
    "open_object_store",
    "validate_key",
]
