"""A real run's Run view as the projector stores it, at a chosen version, for tests that fake
the projection's writes (the API's read barrier, its catch-up): they stage these keys as the
projector would write them, so the view they read back is rendered as in production."""

from __future__ import annotations

from functools import lru_cache

from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec
from services.common.store import MemoryStore
from services.common.topics import RUNS_EVENTS
from services.projections.store import RunViewStore
from tests.unit.run_walks import walk

__all__ = ["MAX_VERSION", "run_id_of", "run_view_keys"]

MAX_VERSION = 30
_CODEC = MessageCodec()


@lru_cache(maxsize=64)
def _records(key: str) -> tuple[InboundRecord, ...]:
    run = walk([("claim", 0, 1_000), *[("renew", 0, 1_000)] * (MAX_VERSION - 2)], key=key)
    assert len(run.events) >= MAX_VERSION
    return tuple(
        InboundRecord(RUNS_EVENTS.name, 0, offset, *_encoded(event))
        for offset, event in enumerate(run.events[:MAX_VERSION])
    )


def _encoded(event: object) -> tuple[bytes, bytes]:
    out = _CODEC.outbound(RUNS_EVENTS.name, getattr(event, "run_id"), event, 0)  # noqa: B009
    return out.key, out.value


def run_view_keys(key: str, version: int) -> tuple[str, dict[str, bytes]]:
    """(run id, the store keys of its view at `version`): fold, history entries, brief, index
    entries; not the projector's offsets, which a fake projection keeps its own way."""
    if not 1 <= version <= MAX_VERSION:
        raise ValueError(f"version {version} is outside 1..{MAX_VERSION}")
    records = _records(key)
    store = MemoryStore()
    RunViewStore(store, _CODEC).apply(records[:version])
    return run_id_of(key), {k: v for k, v in store.scan("") if not k.startswith(("offset/", "meta/"))}


def run_id_of(key: str) -> str:
    """The run id of the run `run_view_keys(key, ...)` stores."""
    return str(_CODEC.decode(_records(key)[0].value).run_id)
