"""QUA-2 as a property of the pure taint graph, checked against an independent reference.

After any sequence of uploads (with derivations), reads, quarantines and clearings, no artifact
reachable from a tainted one is served unless it was cleared after the taint. The reference
recomputes reachability from scratch after every step (a fixpoint over the whole graph), where
the graph aggregate propagates incrementally in `decide`; the property compares what is served.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from services.common.contracts.quarantine import ArtifactRead, ArtifactsCleared
from services.quarantine.domain import ArtifactStatus, GraphState, Rejection

from .helpers import GRAPH, Aggregates, clear, read, register, taint

RUNS = [f"run_{c * 32}" for c in "abcd"]


@dataclass
class Reference:
    """Taint by the definition: a quarantine taints its run's artifacts inside its window and
    everything reachable from them; an artifact born inside a quarantine's window, or from a
    tainted parent, is tainted; a clearing clears exactly the artifacts it names, so an artifact
    cleared after a taint stays cleared until a later taint reaches it again."""

    parents: dict[str, tuple[str, ...]] = field(default_factory=dict)
    producer: dict[str, str] = field(default_factory=dict)
    step: dict[str, int] = field(default_factory=dict)
    quarantined: dict[str, int] = field(default_factory=dict)  # run -> since step (-1: whole)
    tainted: set[str] = field(default_factory=set)

    def inside(self, artifact: str) -> bool:
        since = self.quarantined.get(self.producer[artifact])
        return since is not None and (since < 0 or self.step[artifact] < 0 or self.step[artifact] >= since)

    def close(self, roots: set[str]) -> None:
        """Everything reachable from `roots` (a new taint), found by scanning to a fixpoint."""
        reached = set(roots)
        changed = True
        while changed:
            changed = False
            for artifact, parents in self.parents.items():
                if artifact not in reached and any(p in reached for p in parents):
                    reached.add(artifact)
                    changed = True
        self.tainted |= reached

    def register(self, artifact: str, run: str, step: int, parents: tuple[str, ...]) -> None:
        self.parents[artifact], self.producer[artifact], self.step[artifact] = parents, run, step
        if self.inside(artifact) or any(p in self.tainted for p in parents):
            self.tainted.add(artifact)

    def quarantine(self, run: str, since: int) -> None:
        self.quarantined[run] = since
        self.close({a for a in self.parents if self.producer[a] == run and self.inside(a)})

    def cleared(self, artifacts: tuple[str, ...], lifted: str) -> None:
        self.tainted -= set(artifacts)
        if lifted:
            self.quarantined.pop(lifted, None)


operation = st.one_of(
    st.tuples(
        st.just("upload"), st.sampled_from(RUNS), st.integers(-1, 4), st.lists(st.integers(0, 30), max_size=3)
    ),
    st.tuples(st.just("read"), st.sampled_from(RUNS), st.integers(0, 30)),
    st.tuples(st.just("quarantine"), st.sampled_from(RUNS), st.integers(-1, 4)),
    st.tuples(st.just("clear"), st.integers(0, 30)),
    st.tuples(st.just("lift"), st.sampled_from(RUNS)),
)


_A, _B, _C = (f"run_{c * 32}" for c in "abc")
# Found by hypothesis in a CI run: art2 (run C, derived from run B's art0) is cleared after B's
# quarantine; C then reads run A's art1, A is quarantined, and art2 is suspect again.
_CLEARED_THEN_SUSPECT_AGAIN = [
    ("upload", _B, 0, []),
    ("upload", _A, 0, []),
    ("upload", _C, 0, [0]),
    *[("upload", _A, 0, [])] * 3,
    ("quarantine", _B, 0),
    ("clear", 14),
    ("read", _C, 1),
    ("quarantine", _A, 0),
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(operation, min_size=1, max_size=40))
@example(_CLEARED_THEN_SUSPECT_AGAIN)
def test_nothing_reachable_from_a_taint_is_served_unless_cleared_after_it_QUA_2(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    agg, ref = Aggregates(), Reference()
    names: list[str] = []
    served = 0
    for op in ops:
        kind = op[0]
        if kind == "upload":
            _, run, step, picks = op
            parents = tuple(dict.fromkeys(names[i % len(names)] for i in picks)) if names else ()
            artifact = f"art{len(names)}"
            agg.ok(register(artifact, run, step=step, parents=parents))
            ref.register(artifact, run, step, parents)
            names.append(artifact)
        elif kind == "read" and names:
            _, reader, pick = op
            artifact = names[pick % len(names)]
            result = agg.send(read(artifact, reader))
            if not isinstance(result, Rejection):
                assert isinstance(result[0], ArtifactRead)
                served += 1
                assert artifact not in ref.tainted, f"{artifact} served while reachable from a taint"
            else:
                assert artifact in ref.tainted  # and nothing clean is refused
        elif kind == "quarantine":
            _, run, since = op
            agg.ok(taint(run, step=since))
            ref.quarantine(run, since)
        elif kind == "clear" and names:
            artifact = names[op[1] % len(names)]
            for event in agg.done(clear((artifact,))):
                assert isinstance(event, ArtifactsCleared)
                ref.cleared(event.artifact_ids, "")
            if artifact in ref.tainted:
                ref.cleared((artifact,), "")
        elif kind == "lift":
            for event in agg.done(clear(run=op[1])):
                assert isinstance(event, ArtifactsCleared)
                ref.cleared(event.artifact_ids, op[1])
        graph = agg.states.get(GRAPH)
        if isinstance(graph, GraphState):
            tainted = {i for i, a in graph.artifacts.items() if a.status is ArtifactStatus.TAINTED}
            assert tainted == ref.tainted
            for artifact in graph.artifacts.values():  # the closure holds after every step
                if artifact.status is ArtifactStatus.TAINTED:
                    continue
                # Cleared after its parent's taint (a later taint of that parent would have
                # tainted it again); a later, unrelated taint may make it SUSPECT again, as the
                # lifecycle allows (CLEARED -> SUSPECT), and its clearing stays on record.
                cleared = artifact.status is ArtifactStatus.CLEARED or (
                    artifact.status is ArtifactStatus.SUSPECT and bool(artifact.cleared_by)
                )
                assert (
                    not any(
                        graph.artifacts[p].status is ArtifactStatus.TAINTED for p in artifact.derived_from
                    )
                    or cleared
                )
