"""Read models: Run views folded from runs.events, rebuildable from offset 0 at any time."""
