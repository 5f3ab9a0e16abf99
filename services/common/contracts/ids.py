"""The ids of a Run's parts, and the run they name: part of the published contract.

Attempt and grant ids carry their run's id, so a process given only an attempt id (the API on a
heartbeat, the gateway on an effect) can route to the run's partition without a lookup. The
coordinator mints them (its domain calls these functions); everyone else only parses them.
"""

from __future__ import annotations

from services.common.ids import derived_id

__all__ = ["attempt_id_for", "grant_id_for", "lease_id_for", "run_id_of_attempt", "run_id_of_grant"]


def attempt_id_for(run_id: str, epoch: int) -> str:
    """Attempt ids name their run, so an API given only an attempt id can route to its run."""
    return f"att_{run_id.removeprefix('run_')}_{epoch}"


def run_id_of_attempt(attempt_id: str) -> str | None:
    parts = attempt_id.split("_")
    if len(parts) != 3 or parts[0] != "att" or not parts[2].isdigit():
        return None
    return f"run_{parts[1]}"


def lease_id_for(run_id: str, epoch: int) -> str:
    return derived_id("lease", run_id, str(epoch))


def grant_id_for(run_id: str, command_id: str) -> str:
    """Grant ids name their run, so an upload can be checked against the run's grants."""
    return f"grant_{run_id.removeprefix('run_')}_{derived_id('g', command_id).removeprefix('g_')[:16]}"


def run_id_of_grant(grant_id: str) -> str | None:
    parts = grant_id.split("_")
    if len(parts) != 3 or parts[0] != "grant":
        return None
    return f"run_{parts[1]}"
