"""The saga orchestrator (owner of the Trajectory aggregate). Not built yet: see docs/architecture.md."""
