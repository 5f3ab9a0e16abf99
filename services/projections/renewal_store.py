"""LEASE-2's renewals kept off runs.events (issue 16), folded from runs.renewals.

The lease coordinator commits most renewals of an active lease to runs.renewals instead of
runs.events (services/common/aggregate/keepalives.py), so the Run view's lease holds only the
renewals on runs.events. This store holds the others, one small entry each, with no view to
re-render: a renewal costs a decode and a put, where a Run event re-renders its run's view.

Layout (in the same RocksDB as the views): renewals/<bucket, 8 digits>/<runId>/<epoch, 10
digits>/<sequence, 19 digits> = {"sequence", "at", "expiresAt"} (JSON), the bucket being the
renewal's time over a tenth of runs.renewals' retention (`BUCKET_MS`, 3 days);
offset/runs.renewals/<partition> = the next offset to read, written in the same write as the
batch's entries. A renewal that is also on runs.events (put there later, when the run's next
other event came) has the same entry here and in the view: `lease_record` shows it once. A read
shows the renewals younger than the topic's retention only (`retained_since`), so that every API
instance gives the same answer.

Why time buckets: at 5,000 renewals/s an instance stores about 430 million entries a day, and a
store that kept them all would fill its disk. A bucket whose every renewal is older than the
retention is deleted with one range delete in the batch that passes it, whatever it holds, so
the store holds the retention and at most one bucket more. A read seeks once per bucket the
retention spans (11 to 12), where one key prefix per run would need a sweep over every entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from services.common import jsonbytes
from services.common.contracts import LeaseRenewed, full_name_of
from services.common.kafka import InboundRecord
from services.common.messages import MessageCodec, UndecodableRecord
from services.common.store import KeyValueStore
from services.common.topics import RUNS_RENEWALS

__all__ = [
    "BUCKET_MS",
    "RenewalHistoryStore",
    "leased",
    "retained_since",
    "view_with_kept_renewals",
    "with_kept_renewals",
]

_OFFSETS = f"offset/{RUNS_RENEWALS.name}/"
_LEASE_RENEWED = full_name_of(LeaseRenewed)
_RETENTION_MS = int(RUNS_RENEWALS.config["retention.ms"])
BUCKET_MS = _RETENTION_MS // 10
_BUCKETS = "renewals/"
_LEGACY = "renewal/"  # before time buckets: renewal/<runId>/<epoch>/<sequence> (never reclaimed)
_LEGACY_END = "renewal0"  # "/" + 1: above every legacy key, below "renewals/"


def _bucket(at_ms: int) -> str:
    return f"{_BUCKETS}{max(at_ms, 0) // BUCKET_MS:08d}/"


class RenewalHistoryStore:
    def __init__(self, store: KeyValueStore, codec: MessageCodec) -> None:
        self._store = store
        self._codec = codec
        self._floor: str | None = None  # the oldest bucket that may hold entries (writer only)
        self._newest_at = 0  # the newest renewal time applied since this instance started

    def offsets(self) -> dict[int, int]:
        return {int(k[len(_OFFSETS) :]): int(v) for k, v in self._store.scan(_OFFSETS)}

    def discard_legacy_layout(self) -> bool:
        """Drop entries of the layout before time buckets, which nothing could reclaim, and the
        offsets with them, so that runs.renewals is read again from its start into buckets;
        whether there were any. Called by the writer before it follows the topic."""
        if next(iter(self._store.scan(_LEGACY)), None) is None:
            return False
        offsets = tuple(k for k, _ in self._store.scan(_OFFSETS))
        self._store.write({}, deletes=offsets, delete_ranges=((_LEGACY, _LEGACY_END),))
        return True

    def apply(
        self,
        records: Iterable[InboundRecord],
        on_undecodable: Callable[[InboundRecord, UndecodableRecord], None] | None = None,
        on_stored: Callable[[list[tuple[str, dict[str, Any]]]], None] | None = None,
    ) -> int:
        """Fold a batch of runs.renewals records; returns how many renewals it held. The buckets
        the batch's newest renewal puts wholly past the retention are deleted in the same write.
        `on_stored` gets every decoded record (full name, wire record) once the write is done:
        the API answers kept renewals from them (DecisionListener.deliver_kept), so that an
        accepted renewal is already in the history its answer points to."""
        puts: dict[str, bytes] = {}
        decoded: list[tuple[str, dict[str, Any]]] = []
        renewed_in_batch: list[dict[str, Any]] = []
        for record in records:
            puts[f"{_OFFSETS}{record.partition}"] = str(record.offset + 1).encode()
            try:
                # The wire record, not the contract value: five fields are read, and building
                # the frozen LeaseRenewed was a third of a renewal's cost here (one per kept
                # renewal, in every API instance).
                full_name, renewed = self._codec.decode_record(record.value)
            except UndecodableRecord as exc:
                if on_undecodable is not None:
                    on_undecodable(record, exc)
                continue
            decoded.append((full_name, renewed))
            if full_name == _LEASE_RENEWED:
                renewed_in_batch.append(renewed)
                self._newest_at = max(self._newest_at, renewed["occurredAt"])
        expired_before = _bucket(retained_since(self._newest_at))
        for renewed in renewed_in_batch:
            at = renewed["occurredAt"]
            bucket = _bucket(at)
            if bucket < expired_before:  # already past the retention: a read would not show it
                continue
            key = f"{bucket}{renewed['runId']}/{renewed['epoch']:010d}/{renewed['sequence']:019d}"
            puts[key] = jsonbytes.dumps(
                {"sequence": renewed["sequence"], "at": at, "expiresAt": renewed["expiresAt"]}
            )
        if puts:
            expired = self._expired(expired_before)
            self._store.write(puts, delete_ranges=expired)
            if expired:  # raised only once written: a failed write deletes the range next time
                self._floor = expired_before
        if on_stored is not None and decoded:
            on_stored(decoded)
        return len(renewed_in_batch)

    def _expired(self, expired_before: str) -> tuple[tuple[str, str], ...]:
        if self._floor is None:  # first batch since start: where the oldest entry is
            oldest = next(iter(self._store.scan(_BUCKETS)), None)
            self._floor = oldest[0][: len(expired_before)] if oldest is not None else expired_before
        return ((self._floor, expired_before),) if self._floor < expired_before else ()

    def of(self, run_id: str, not_before_ms: int) -> dict[int, list[dict[str, Any]]]:
        """Epoch -> the run's kept renewals under it, by sequence; those renewed before
        `not_before_ms` (`retained_since`) left out. Reads the buckets from `not_before_ms` to
        a retention and two buckets past it (a coordinator's clock may run ahead of ours)."""
        renewals: dict[int, list[dict[str, Any]]] = {}
        first = max(not_before_ms, 0) // BUCKET_MS
        for bucket in range(first, (not_before_ms + _RETENTION_MS) // BUCKET_MS + 3):
            prefix = f"{_BUCKETS}{bucket:08d}/{run_id}/"
            for key, raw in self._store.scan(prefix):
                entry = jsonbytes.loads(raw)
                if entry["at"] < not_before_ms:
                    continue
                epoch = int(key[len(prefix) :].split("/", 1)[0])
                renewals.setdefault(epoch, []).append(entry)
        for entries in renewals.values():  # buckets in time order; a sequence may be older
            entries.sort(key=lambda entry: int(entry["sequence"]))
        return renewals


def retained_since(now_ms: int) -> int:
    """The oldest renewal time every API instance can show: runs.renewals keeps every record
    younger than its retention, and may keep older ones until their segment goes. An instance
    that has followed the topic for longer holds renewals a newer one never read, so each shows
    only those younger than the retention, and any two give the same answer (issue 16)."""
    return now_ms - _RETENTION_MS


def with_kept_renewals(lease: dict[str, Any], kept: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """A LEASE-2 lease record (a Run view's `lease` or `leaseHistory` entry) with every renewal:
    those on runs.events it holds and the kept ones, once each, by sequence; its expiry the last
    renewal's while the lease is held."""
    extra = kept.get(int(lease.get("epoch", 0)), [])
    if not extra:
        return lease
    by_sequence = {int(r["sequence"]): r for r in extra}
    by_sequence.update({int(r["sequence"]): r for r in lease.get("renewals", [])})
    renewals = [by_sequence[s] for s in sorted(by_sequence)]
    merged = {**lease, "renewals": renewals}
    if lease.get("certainty") == "active" and renewals:
        merged["expiresAt"] = max(int(lease.get("expiresAt") or 0), int(renewals[-1]["expiresAt"]))
    return merged


def leased(view: dict[str, Any]) -> bool:
    """Whether a Run view has a lease record for kept renewals to merge into."""
    return bool(view.get("lease") or view.get("leaseHistory"))


def view_with_kept_renewals(view: dict[str, Any], kept: dict[int, list[dict[str, Any]]]) -> dict[str, Any]:
    """A Run view with `with_kept_renewals` applied to its lease and every earlier one."""
    if not kept:
        return view
    lease = view.get("lease")
    return {
        **view,
        "lease": with_kept_renewals(lease, kept) if lease else lease,
        "leaseHistory": [with_kept_renewals(old, kept) for old in view.get("leaseHistory", [])],
    }
