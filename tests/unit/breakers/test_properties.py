"""Properties of the breaker over random histories (BRK-2, DUR-1): never more than one canary in
flight across the fleet, and the state is always the fold of the events (replay = incremental),
also through the store's codec."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from services.breakers.domain import TRANSITIONS, Rejection, fold
from services.breakers.state_codec import decode_state, encode_state
from services.common.contracts import (
    SUCCESS,
    TRANSPORT_FAILURE,
    BreakerClosed,
    BreakerDisabled,
    BreakerForcedOpen,
    BreakerReopened,
    BreakerReset,
    CanaryExpired,
    CanaryGranted,
)

from .support import POLICY, Breaker, disable, force_open, outcome, report, request, reset

INSTANCES = ("gw-a", "gw-b", "gw-c")
ACTIONS = (
    *("fail",) * 8, "succeed", "succeed", *("request",) * 6, *("report",) * 6, *("tick",) * 4,
    "force", "disable", "reset", "again", "again",
)  # fmt: skip
# Opens after 3 outcomes, so random histories reach Open, Half-open and the canary often.
PROPERTY_POLICY = replace(POLICY, min_calls=3)
ENDS_A_CANARY = (
    CanaryExpired,
    BreakerClosed,
    BreakerReopened,
    BreakerForcedOpen,
    BreakerDisabled,
    BreakerReset,
)


@dataclass(frozen=True)
class Step:
    action: str
    instance: int
    advance_ms: int
    ok: bool


steps = st.lists(
    st.builds(
        Step,
        st.sampled_from(ACTIONS),
        st.integers(0, len(INSTANCES) - 1),
        st.sampled_from((0, 1, 500, 5_000, 15_000, 30_000, 61_000)),
        st.booleans(),
    ),
    min_size=1,
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_never_more_than_one_canary_in_flight_and_replay_equals_incremental_brk_2_dur_1(
    history: list[Step],
) -> None:
    _check(history)


def test_the_random_histories_do_reach_grants_takeovers_and_expiries() -> None:
    """The property above is only as good as the histories it sees: a long one walks them all."""
    rng = random.Random(7)
    history = [
        Step(
            rng.choice(ACTIONS),
            rng.randrange(len(INSTANCES)),
            rng.choice((0, 500, 15_000, 30_000)),
            rng.random() < 0.3,
        )
        for _ in range(3000)
    ]
    seen = _check(history, fold_every=100)
    assert seen["CanaryGranted"] >= 20 and seen["CanaryExpired"] >= 3 and seen["BreakerClosed"] >= 1
    assert seen["BreakerReopened"] >= 3 and seen["BreakerOpened"] >= 5 and seen["takeover"] >= 1


def _check(history: list[Step], fold_every: int = 1) -> Counter[str]:
    seen: Counter[str] = Counter()
    b = Breaker(policy=PROPERTY_POLICY)
    grants: dict[str, list[CanaryGranted]] = {i: [] for i in INSTANCES}
    in_flight: list[CanaryGranted] = []
    last = None
    seqs = dict.fromkeys(INSTANCES, 0)
    for number, step in enumerate(history):
        b.now += step.advance_ms
        instance = INSTANCES[step.instance]
        before = b.state.status if b.state is not None else None
        if step.action == "tick":
            events: tuple = b.tick()
        else:
            if step.action in ("fail", "succeed"):
                seqs[instance] += 1
                command = outcome(seqs[instance], TRANSPORT_FAILURE if step.action == "fail" else SUCCESS,
                                  instance=instance)  # fmt: skip
            elif step.action == "request":
                command = request(instance)
            elif step.action == "report":
                held = b.state.canary if b.state is not None else None
                if held is not None and step.instance != 0:
                    instance = held.instance_id  # mostly the holder reports; now and then another
                mine = grants[instance]
                canary = mine[-1].canary_id if mine else "cny_never"
                command = report(canary, SUCCESS if step.ok else TRANSPORT_FAILURE, instance=instance)
            elif step.action == "force":
                command = force_open()
            elif step.action == "disable":
                command = disable()
            elif step.action == "reset":
                command = reset()
            else:
                # A redelivery of the last command the breaker accepted (the runtime itself drops
                # a refused one by its id): never a second answer.
                if last is None:
                    continue
                command = last
            answer = b.send(command)
            if step.action == "again":
                assert answer == (), "a redelivered command that was accepted adds nothing"
            events = () if isinstance(answer, Rejection) else answer
            if not isinstance(answer, Rejection):
                last = command
        for event in events:
            seen[type(event).__name__] += 1
            if isinstance(event, CanaryGranted):
                seen["takeover"] += bool(event.expired_canary_id)
                # Granted only when no other canary is in flight (a lapsed lease counts as ended).
                assert all(c.expires_at <= event.occurred_at for c in in_flight), (in_flight, event)
                in_flight = [event]
                grants[event.instance_id].append(event)
            elif isinstance(event, ENDS_A_CANARY):
                in_flight = []
        assert len(in_flight) <= 1
        held = b.state.canary if b.state is not None else None
        assert (held.canary_id if held else None) == (in_flight[0].canary_id if in_flight else None)
        if b.state is not None:
            if before is not None:
                assert b.state.status in TRANSITIONS[before]
            if number % fold_every == 0 or number == len(history) - 1:
                assert fold(b.events) == b.state, "replay equals incremental"
            assert decode_state(encode_state(b.state)) == b.state
    assert [e.version for e in b.events] == list(range(1, len(b.events) + 1))
    return seen
