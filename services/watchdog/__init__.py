"""The semantic watchdog (WD-1..WD-6): judges a run's progress by its environment, not its heartbeats.

`domain/` is the pure core (detectors, the intervention ladder, decide/evolve); `processor.py`
runs it on the one aggregate runtime; `python -m services.watchdog` is the service.
"""
