"""Tenure's reference fenced resource: a small ledger that is NOT part of Tenure.

It receives external effects the way a third-party system would, and checks the sender's
fencing epoch itself (SPEC LEASE-3), deduplicates by idempotency key (EXE-6) and answers the
"did this effect happen?" probe used for reconcile-before-retry (REC-6). Tests and demos use it
to show that a previous lease holder is refused by the recipient, not by Tenure's good will.

Run it with ``python -m services.fenced_ledger``; see ``app`` for the HTTP contract.
"""

from __future__ import annotations

__all__: list[str] = []
