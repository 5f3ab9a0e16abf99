"""Fleet-wide circuit breakers (BRK-1, BRK-2): one event-sourced breaker per tool endpoint.

`domain/` is the pure core (the lifecycle, decide/evolve, the timers); `processor.py` runs it on
the one aggregate runtime; `python -m services.breakers` is the service. Gateway instances (and
runners) follow the breakers with `view.BreakerBoard` and talk to them with `client.BreakerClient`.
"""
