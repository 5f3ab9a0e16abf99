"""The effect gateway: the one door through which runners send external effects (LEASE-3, REC-6)."""
