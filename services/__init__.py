"""Tenure: a control plane for long-running autonomous agent runs, event-sourced on Kafka."""
