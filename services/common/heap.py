"""The start-up heap, taken out of the cyclic garbage collector's full passes.

A Tenure process imports its frameworks (FastAPI, pydantic, faust, fastavro's parsed schemas)
before it serves: over 100,000 objects that live as long as the process. CPython's full
collection walks every tracked object, those included, and it runs every few seconds under load
(each renewal replaces a cached state or fold): about 70 ms per pass on this machine for the
start-up objects alone, during which no thread of the process runs. That pause lands on
whichever acknowledgement is in flight. `gc.freeze()` moves what exists now to a permanent
generation that collections skip (Python's own advice for long-lived servers); objects made
later are collected as before, and frozen ones are still freed by reference counting.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_startup_heap"]


def freeze_startup_heap() -> int:
    """Collect once, then freeze every object that is left; the number frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
