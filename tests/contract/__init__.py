"""Contract suites: one set of tests every implementation of a port must pass."""
