"""The lease coordinator: single writer of the Run aggregate (admission, attempts, leases, cancel)."""
