"""The fault-injection scoreboard (DUR-3): `python -m bench.faults` (see __main__.py).

workload.py (seeded trajectories, agent, fault plan), outcomes.py (classification from the
environment's audit, metrics), runner_api.py (Reporter, ConfigRunner, SimClient), ablations.py
(configurations 1-3), tenure_runner.py and tenure_system.py (configuration 4), worker.py (the
long-lived runner process), harness.py (pools, kills, restarts, table; ``run_scoreboard``),
plot.py (the outcome mix as a PNG).
"""
