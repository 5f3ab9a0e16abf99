"""Local state stores: the rocksdict adapter and its in-memory twin, behind one small contract.

Processors keep their state and the log offset it reflects in the same store and change both in
one atomic write, so a crash can never leave state that claims more (or less) than the log says.
"""

from services.common.store._contract import KeyValueStore, StoreReadOnly
from services.common.store._errors import is_transient_store_error
from services.common.store._memory import MemoryStore
from services.common.store._rocks import RocksStore

__all__ = ["KeyValueStore", "MemoryStore", "RocksStore", "StoreReadOnly", "is_transient_store_error"]
