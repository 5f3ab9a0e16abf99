"""Schedules (EXE-14): cron in an IANA zone, overlap and misfire policies, DST done right.

`python -m services.schedules` runs the processor; services/schedules/domain is its pure core.
"""

__all__: list[str] = []
