"""free_port hands each caller its own port (services/common/broker.py).

A test system picks a port for each of its services before any of them binds it. Two picks of
the same port once let one service's health server answer another's API requests (a POST /runs
got a 404). A process therefore never hands out a port it handed out lately.
"""

from __future__ import annotations

from services.common.broker import free_port


def test_a_process_never_hands_out_the_same_port_twice_in_a_row_of_picks() -> None:
    # 300 random picks from a few thousand ports would repeat one almost surely without the rule.
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
