"""The artifact object store (EXE-15): content-addressed, immutable keys, verifiable manifests.

`FilesystemObjectStore` is the default implementation and `MemoryObjectStore` its twin for unit
tests; both honour the `ObjectStore` contract (tests/contract/test_objectstore_contract.py).
The service calls `verify` with a ResultManifest's entries before accepting terminal success.
"""

from services.common.objectstore._filesystem import FilesystemObjectStore
from services.common.objectstore._memory import MemoryObjectStore
from services.common.objectstore._store import (
    MAX_KEY_CHARS,
    CorruptKeyRecord,
    InvalidKey,
    InvalidMediaType,
    KeyExists,
    ManifestEntry,
    ObjectNotFound,
    ObjectStore,
    ObjectStoreError,
    ObjectTooLarge,
    StoredObject,
    validate_key,
)

__all__ = [
    "MAX_KEY_CHARS",
    "CorruptKeyRecord",
    "FilesystemObjectStore",
    "InvalidKey",
    "InvalidMediaType",
    "KeyExists",
    "ManifestEntry",
    "MemoryObjectStore",
    "ObjectNotFound",
    "ObjectStore",
    "ObjectStoreError",
    "ObjectTooLarge",
    "StoredObject",
    "validate_key",
]
