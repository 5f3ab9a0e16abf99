"""BRK-3: every retry loop waits a full-jitter draw of services/common/backoff.py, never a fixed or
deterministic exponential sleep (128 agents retrying in step = 64,000 req/s; with full jitter 64).

The scan reads every module of services/ (ast, no import) and looks at every loop (for, while,
async for) for a wait: `time.sleep`, `asyncio.sleep`, any `*sleep(...)` (injected sleeps such as
`self._sleep`) and any `.wait(...)` with a timeout (`threading.Event.wait`). A wait is an offence:

  * when its delay is a deterministic exponential: `2 ** k`, `1 << k`, `pow(...)`, or a name the
    function grows by multiplication (`delay *= 2`, `delay = delay * 2`), in any loop;
  * when its delay is a constant (a literal, an UPPER_CASE name, or a local bound only to
    literals) and the loop is a retry loop: the wait is in an `except` handler, or the loop body
    has a `try` whose handler swallows the failure and goes round again.

A delay drawn from the backoff (`next_delay()`, `full_jitter_s`, `full_jitter_ms`) is fine, and
so is a computed one (a deadline minus now, a lease's renewal time): those are schedules, not
retries. A fixed-interval poll of a condition with no failure handled is a tick, not a retry.

Offenders that are not this test's to fix are listed in ALLOWED with the reason they are left;
each entry must still match an offence, so a fixed file must leave the list too.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SERVICES = REPO / "services"
BACKOFF = SERVICES / "common" / "backoff.py"
JITTER_CALLS = {"next_delay", "full_jitter_s", "full_jitter_ms"}

# "<path under services/>:<function>" -> why the offence is left as it is (for now).
ALLOWED: dict[str, str] = {}


@dataclass(frozen=True)
class Offence:
    where: str  # "<path under services/>:<function>"
    line: int
    kind: str  # "exponential" | "fixed"
    code: str

    def __str__(self) -> str:
        return f"services/{self.where.split(':')[0]}:{self.line} ({self.kind}) {self.code}"


def _called_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _delay_of(call: ast.Call) -> ast.expr | None:
    """The delay argument of a wait call, or None when `call` is not a wait."""
    name = _called_name(call)
    if name.endswith("sleep"):
        return (
            call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "seconds"), None)
        )
    if name == "wait" and isinstance(call.func, ast.Attribute):
        if call.args:
            return call.args[0]
        return next((k.value for k in call.keywords if k.arg == "timeout"), None)
    return None


def _walk_local(node: ast.AST) -> list[ast.AST]:
    """`node` and everything below it, except nested functions, lambdas and classes."""
    found, stack = [], [node]
    while stack:
        current = stack.pop()
        found.append(current)
        for child in ast.iter_child_nodes(current):
            if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                stack.append(child)
    return found


class _Function:
    """What one function (or the module body) binds its local names to."""

    def __init__(self, body: ast.AST) -> None:
        self.constant: dict[str, bool] = {}
        self.grown: set[str] = set()
        for node in _walk_local(body):
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
                if isinstance(node.op, (ast.Mult, ast.Pow, ast.LShift)):
                    self.grown.add(node.target.id)
                self.constant[node.target.id] = False
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if not isinstance(target, ast.Name):
                        continue
                    names = {n.id for n in ast.walk(node.value) if isinstance(n, ast.Name)}
                    grows = target.id in names and any(
                        isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Mult, ast.Pow, ast.LShift))
                        for n in ast.walk(node.value)
                    )
                    if grows:
                        self.grown.add(target.id)
                    literal = isinstance(node.value, ast.Constant) and isinstance(
                        node.value.value, (int, float)
                    )
                    self.constant[target.id] = self.constant.get(target.id, True) and literal

    def kind(self, delay: ast.expr) -> str:
        """ "jitter", "exponential", "fixed" or "computed"."""
        nodes = list(ast.walk(delay))
        if any(isinstance(n, ast.Call) and _called_name(n) in JITTER_CALLS for n in nodes):
            return "jitter"
        if any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Pow, ast.LShift)) for n in nodes):
            return "exponential"
        if any(isinstance(n, ast.Call) and _called_name(n) == "pow" for n in nodes):
            return "exponential"
        names = [n.id for n in nodes if isinstance(n, ast.Name)]
        if any(name in self.grown for name in names):
            return "exponential"
        if self._fixed(delay):
            return "fixed"
        return "computed"

    def _fixed(self, delay: ast.expr) -> bool:
        if isinstance(delay, ast.Constant):
            return isinstance(delay.value, (int, float))
        if isinstance(delay, ast.Name):
            return delay.id.isupper() or self.constant.get(delay.id, False)
        if isinstance(delay, ast.Attribute):
            return delay.attr.lstrip("_").isupper()
        if isinstance(delay, ast.BinOp):
            return self._fixed(delay.left) and self._fixed(delay.right)
        return False


def _swallows(handler: ast.ExceptHandler) -> bool:
    """The handler lets the loop go round again (it does not end by raising, returning or breaking)."""
    last = handler.body[-1]
    return not isinstance(last, (ast.Raise, ast.Return, ast.Break))


def _offences_in(path: Path) -> list[Offence]:
    return _offences_in_source(path.relative_to(SERVICES).as_posix(), path.read_text(encoding="utf-8"))


def _offences_in_source(relative: str, source: str) -> list[Offence]:
    tree = ast.parse(source, relative)
    scopes: list[tuple[str, ast.AST]] = [("<module>", tree)]
    scopes += [
        (node.name, node)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]
    offences: dict[tuple[int, int], Offence] = {}
    for name, scope in scopes:
        function = _Function(scope)
        for loop in _walk_local(scope):
            if not isinstance(loop, (ast.For, ast.AsyncFor, ast.While)):
                continue
            body = [n for stmt in loop.body for n in _walk_local(stmt)]
            in_handlers = {
                id(n)
                for h in body
                if isinstance(h, ast.ExceptHandler)
                for stmt in h.body
                for n in _walk_local(stmt)
            }
            retrying = any(isinstance(h, ast.ExceptHandler) and _swallows(h) for h in body)
            for call in body:
                if not isinstance(call, ast.Call):
                    continue
                delay = _delay_of(call)
                if delay is None:
                    continue
                kind = function.kind(delay)
                if kind == "exponential" or (kind == "fixed" and (retrying or id(call) in in_handlers)):
                    key = (call.lineno, call.col_offset)
                    offences[key] = Offence(f"{relative}:{name}", call.lineno, kind, ast.unparse(call))
    return list(offences.values())


@cache
def _offences() -> tuple[Offence, ...]:
    return tuple(o for path in sorted(SERVICES.rglob("*.py")) if path != BACKOFF for o in _offences_in(path))


def test_no_retry_loop_sleeps_a_fixed_or_deterministic_exponential_delay_brk_3() -> None:
    offences = [o for o in _offences() if o.where not in ALLOWED]
    assert offences == [], "retry loops must wait services/common/backoff.py's full jitter:\n" + "\n".join(
        map(str, offences)
    )


def test_every_allowed_offence_still_exists_and_has_a_reason() -> None:
    found = {o.where for o in _offences()}
    assert set(ALLOWED) <= found, f"fixed, so remove from ALLOWED: {sorted(set(ALLOWED) - found)}"
    assert all(len(reason) > 40 for reason in ALLOWED.values())


# --- the scanner itself: it must see what it is meant to see -----------------------------------


def _scan(source: str) -> list[str]:
    return [o.kind for o in _offences_in_source("probe.py", source)]


def test_the_scan_finds_fixed_and_exponential_retry_sleeps_and_spares_jitter_and_schedules(
    tmp_path: Path,
) -> None:
    fixed = """
import time
def call(): ...
def retry():
    while True:
        try:
            return call()
        except OSError:
            time.sleep(0.5)
"""
    exponential = """
import asyncio
async def retry(k):
    for attempt in range(5):
        try:
            return await call()
        except OSError:
            pass
        await asyncio.sleep(0.1 * 2 ** attempt)
"""
    grown = """
import threading
def retry(stop):
    delay = 0.1
    while not stop.is_set():
        if call():
            return
        stop.wait(delay)
        delay *= 2
"""
    fine = """
import time
from services.common.backoff import Backoff
def retry(stop, deadline):
    backoff = Backoff()
    while True:
        try:
            return call()
        except OSError:
            time.sleep(backoff.next_delay())
    while time.monotonic() < deadline:
        time.sleep(0.05)  # a poll of a condition: no failure handled
    while True:
        try:
            call()
        except OSError:
            stop.wait(deadline - time.monotonic())  # a schedule, computed
"""
    assert _scan(fixed) == ["fixed"]
    assert _scan(exponential) == ["exponential"]
    assert _scan(grown) == ["exponential"]
    assert _scan(fine) == []
