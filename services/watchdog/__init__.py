"""The semantic watchdog: progress verdicts, quarantine and taint.

Not built yet; see docs/architecture.md.
"""
