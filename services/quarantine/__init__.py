"""Blast-radius quarantine and taint (QUA-1..QUA-3): the quarantine processor and its executor."""
