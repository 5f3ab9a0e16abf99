"""The managed runner host: runs one agent command for one run, holds its lease, obeys Tenure.

claim       LeaseKeeper.claim through the runner SDK; the keeper renews from its own thread
launch      the command as a ManagedChild (own process group, cgroup freezer, netns + veth),
            told what it needs by environment (AGENT_ENV below), never the host's own key; in a
            namespace of its own it reaches the API and the gateway through relays on the host
            end of its veth (relay.py), cut off with the rest when the link is severed
quarantine  one long-poll per child on GET /runs/{id}/quarantine; the moment it answers
            "quarantined": freeze the tree FIRST, then sever its network (both timed from the
            answer's receipt), report each stage (suspended, severed) in that order, retried
            with full jitter, then stop renewing. The child stays frozen for the operator; the
            host reports no outcome for it and never runs compensation (QUA-1).
cancel      a stop request on a heartbeat answer (EXE-7): SIGTERM the group, wait the grace
            period (never past the coordinator's confirm-by), SIGKILL (a frozen tree is thawed
            after the kill is queued), then confirm with finish("cancelled"); a deadline stop
            (EXE-10) confirms with failed/DEADLINE_EXCEEDED
exit        exit 0 -> succeeded (with the manifest the child wrote, if any), else failed
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from services.common.backoff import Backoff
from services.common.logs import log_fields
from services.runner_host.child import Containment, ContainmentTimes, ManagedChild
from services.runner_host.control import QuarantineChannel, QuarantineUnavailable, QuarantineView, StageReport
from services.runner_host.relay import Relay
from services.runner_sdk.certainty import Certainty
from services.runner_sdk.client import ReportOutcome, TenureClient
from services.runner_sdk.errors import RunNotFound, TenureUnavailable
from services.runner_sdk.keeper import LeaseKeeper, StopRequest

__all__ = ["AGENT_ENV", "HostConfig", "HostResult", "RunnerHost"]

log = logging.getLogger("tenure.runner_host")

# What the child is told (its environment holds nothing else of the host's TENURE_* / KAFKA_*).
AGENT_ENV = (
    "TENURE_RUN_ID",
    "TENURE_ATTEMPT_ID",
    "TENURE_LEASE_EPOCH",
    "TENURE_API_URL",  # a relay on the host end of its veth when it has a namespace of its own
    "TENURE_GATEWAY_URL",  # likewise
    "TENURE_RUN_CREDENTIAL",  # only when the assignment carries a per-run credential
    "TENURE_RESULT_MANIFEST",  # where the child may write its ResultManifest (a JSON list)
    "TENURE_HOST_ADDRESS",  # the host end of its veth, when it has a namespace of its own
)
_TICK_S = 0.05
_REPORT_RETRIES = 5


@dataclass(frozen=True)
class HostConfig:
    run_id: str
    host_id: str
    command: tuple[str, ...]
    api_url: str
    gateway_url: str
    capabilities: tuple[str, ...] = ()
    lease_seconds: int | None = None
    heartbeat_seconds: int | None = None
    stop_grace_s: float = 10.0
    poll_wait_ms: int = 25_000
    claim_wait_s: float = 0.0  # how long to wait for the run to be submitted / the API to answer
    workdir: Path | None = None
    child_log: Path | None = None
    base_env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class HostResult:
    """How the run ended on this host. `outcome` is what was reported through the SDK, or
    "quarantined" / "lease-lost" / "not-claimed" when nothing was (or could be)."""

    outcome: str
    exit_code: int | None = None
    forced: bool = False
    reported: bool = False
    containment: ContainmentTimes | None = None
    stages: list[StageReport] = field(default_factory=list)
    detail: str = ""


KeeperFactory = Callable[..., LeaseKeeper]


class RunnerHost:
    def __init__(
        self,
        config: HostConfig,
        containment: Containment,
        client: TenureClient,
        channel: QuarantineChannel,
        *,
        keeper_factory: KeeperFactory = LeaseKeeper.claim,
        on_contained: Callable[[ContainmentTimes], None] | None = None,
    ) -> None:
        if not config.command:
            raise ValueError("the runner host needs an agent command")
        self.config = config
        self.containment = containment
        self._client = client
        self._channel = channel
        self._keeper_factory = keeper_factory
        self._on_contained = on_contained
        self.keeper: LeaseKeeper | None = None
        self.child: ManagedChild | None = None
        self.result: HostResult | None = None
        self.quarantine: QuarantineView | None = None
        self._lock = threading.Lock()  # the quarantine flag vs. the decision to report an outcome
        self._quarantined = threading.Event()
        self._cleared = threading.Event()
        self._contained = threading.Event()
        self._stages_done = threading.Event()
        self._shutdown = threading.Event()
        self._wake = threading.Event()
        self._stop: StopRequest | None = None
        self._stages: list[StageReport] = []
        self._child_log: BinaryIO | None = None

    # --- control from outside ----------------------------------------------------------------

    def request_shutdown(self) -> None:
        """The host itself is asked to stop (SIGTERM): stop the child, report it failed."""
        self._shutdown.set()
        self._wake.set()

    @property
    def quarantined(self) -> bool:
        return self._quarantined.is_set()

    def wait_contained(self, timeout_s: float) -> bool:
        return self._contained.wait(timeout_s)

    def status(self) -> dict[str, Any]:
        keeper, child = self.keeper, self.child
        return {
            "runId": self.config.run_id,
            "hostId": self.config.host_id,
            "freezer": self.containment.freezer_mechanism,
            "network": self.containment.network_mechanism,
            "lease": None if keeper is None else keeper.state.value,
            "childPid": None if child is None or child.process is None else child.pid,
            "childRunning": child is not None and child.process is not None and child.poll() is None,
            "quarantined": self.quarantined,
            "stopRequested": self._stop is not None,
        }

    # --- the run -------------------------------------------------------------------------------

    def run(self) -> HostResult:
        """Claim, launch, supervise, report. Call from the main thread (see ManagedChild.start)."""
        cfg = self.config
        keeper = self._claim()
        self.keeper = keeper
        keeper.start()
        child = ManagedChild(self.containment)
        self.child = child
        watcher = threading.Thread(target=self._watch, name=f"tenure-quarantine-{cfg.run_id}", daemon=True)
        relays: list[Relay] = []
        try:
            child.prepare()
            api_url, gateway_url = cfg.api_url, cfg.gateway_url
            if child.network.host_address:
                # The child's namespace reaches nothing but the host end of its veth: relay the
                # API and the gateway there (cut off with the rest when the link is severed).
                relays = [Relay(child.network.host_address, url).start() for url in (api_url, gateway_url)]
                api_url, gateway_url = relays[0].url, relays[1].url
            env = self._agent_env(keeper, child, api_url, gateway_url)
            child.start(cfg.command, env, cwd=cfg.workdir, **self._log_files())
            log.info(
                "run %s attempt %s: child %d started (freezer %s, network %s)",
                cfg.run_id,
                keeper.lease.attempt_id,
                child.pid,
                child.freezer.mechanism,
                child.network.mechanism,
                extra=log_fields(run_id=cfg.run_id),
            )
            watcher.start()
            self.result = self._supervise(keeper, child)
        finally:
            self._shutdown.set()
            if self._quarantined.is_set():  # let the stage reports finish (they retry on their own)
                self._stages_done.wait(self._channel.report_deadline_s * 2 + 5)
            child.close()
            for relay in relays:
                relay.close()
            if self._child_log is not None:
                self._child_log.close()
            keeper.stop()
        self.result.stages = list(self._stages)
        self.result.containment = child.contained
        return self.result

    def _claim(self) -> LeaseKeeper:
        """Claim the run; with `claim_wait_s`, a run not submitted yet or an API not up yet is
        asked again after a full-jitter wait (BRK-3) until that much time has passed."""
        cfg = self.config
        deadline = time.monotonic() + cfg.claim_wait_s
        backoff = Backoff(0.2, 5.0)
        while True:
            try:
                return self._keeper_factory(
                    self._client,
                    cfg.run_id,
                    cfg.host_id,
                    list(cfg.capabilities),
                    cfg.lease_seconds,
                    cfg.heartbeat_seconds,
                    on_stop_requested=self._on_stop_requested,
                )
            except (RunNotFound, TenureUnavailable) as exc:
                delay = backoff.next_delay()
                if self._shutdown.is_set() or time.monotonic() + delay > deadline:
                    raise
                if backoff.attempt == 1:
                    log.info(
                        "run %s not claimable yet (%s); waiting for it",
                        cfg.run_id,
                        exc,
                        extra=log_fields(run_id=cfg.run_id),
                    )
            self._shutdown.wait(delay)

    def _log_files(self) -> dict[str, Any]:
        if self.config.child_log is None:
            return {}
        self._child_log = handle = self.config.child_log.open("ab")  # open while the child runs
        return {"stdout": handle.fileno(), "stderr": handle.fileno()}

    def _agent_env(
        self, keeper: LeaseKeeper, child: ManagedChild, api_url: str, gateway_url: str
    ) -> dict[str, str]:
        lease = keeper.lease
        base = {k: v for k, v in self.config.base_env.items() if not k.startswith(("TENURE_", "KAFKA_"))}
        env = {
            **base,
            "TENURE_RUN_ID": lease.run_id,
            "TENURE_ATTEMPT_ID": lease.attempt_id,
            "TENURE_LEASE_EPOCH": str(lease.epoch),
            "TENURE_API_URL": api_url,
            "TENURE_GATEWAY_URL": gateway_url,
            "TENURE_RESULT_MANIFEST": str(self._manifest_path(child)),
        }
        credential = lease.assignment.get("credential") or lease.assignment.get("runCredential")
        if isinstance(credential, str) and credential:
            env["TENURE_RUN_CREDENTIAL"] = credential
        if child.network.host_address:
            env["TENURE_HOST_ADDRESS"] = child.network.host_address
        return env

    def _manifest_path(self, child: ManagedChild) -> Path:
        return (self.config.workdir or Path("/tmp")) / f"{child.name}.manifest.json"

    def _supervise(self, keeper: LeaseKeeper, child: ManagedChild) -> HostResult:
        kill_at: float | None = None
        forced = False
        why = ""
        while True:
            if self._quarantined.is_set():
                return self._hold_quarantined(child)
            code = child.poll()
            if code is not None:
                break
            now = time.monotonic()
            if kill_at is None:
                if self._stop is not None:
                    why = f"{self._stop.kind} stop requested"
                elif self._shutdown.is_set():
                    why = "the runner host was asked to stop"
                elif keeper.state is Certainty.LOST and not self._quarantine_took_the_lease():
                    why = "the lease was lost"
                if why:
                    log.info(
                        "run %s: %s; SIGTERM to the child, then SIGKILL after the grace",
                        self.config.run_id,
                        why,
                        extra=log_fields(run_id=self.config.run_id),
                    )
                    child.terminate()
                    kill_at = now + self._grace_s(now)
            elif now >= kill_at and not forced:
                log.warning(
                    "run %s: the child outlived its grace period; killing it",
                    self.config.run_id,
                    extra=log_fields(run_id=self.config.run_id),
                )
                forced = True
                with self._lock:
                    if not self._quarantined.is_set():
                        child.force_stop()
            self._wake.wait(_TICK_S)
            self._wake.clear()
        with self._lock:
            quarantined = self._quarantined.is_set()
        if quarantined:
            return self._hold_quarantined(child)
        # The exit came first: its outcome is reported; a quarantine from here on still
        # contains (the exited tree and its network), but cannot take the report back.
        return self._report(keeper, child, code, forced, why)

    def _quarantine_took_the_lease(self) -> bool:
        """A lost lease may be a quarantine's revocation arriving before the long-poll's answer:
        ask once (up to half a second) before SIGTERM lets the child run a handler of its own.
        True, and contained, if the run is quarantined."""
        if self._quarantined.is_set():
            return True
        try:
            view = self._channel.poll(self.config.run_id, 0, 500)
        except QuarantineUnavailable as exc:
            log.warning(
                "run %s: lease lost and the quarantine unreadable (%s)",
                self.config.run_id,
                exc,
                extra=log_fields(run_id=self.config.run_id),
            )
            return False
        if not view.quarantined:
            return False
        self.quarantine = view
        self._contain(time.monotonic())
        return True

    def _grace_s(self, now: float) -> float:
        grace = self.config.stop_grace_s
        stop = self._stop
        if stop is not None and stop.confirm_by is not None:
            # Leave a second for the confirmation itself before the coordinator's deadline.
            grace = min(grace, max(0.0, stop.confirm_by - now - 1.0))
        return grace

    def _report(
        self, keeper: LeaseKeeper, child: ManagedChild, code: int, forced: bool, why: str
    ) -> HostResult:
        outcome: ReportOutcome
        error_code, detail = "", ""
        manifest: Sequence[Mapping[str, Any]] | None = None
        stop = self._stop
        if stop is not None:
            if stop.kind == "deadline":
                outcome, error_code, detail = "failed", "DEADLINE_EXCEEDED", "stopped at the run's deadline"
            else:
                outcome, detail = "cancelled", f"stopped by the runner host (exit {code}, forced={forced})"
        elif keeper.state is Certainty.LOST:
            return HostResult("lease-lost", code, forced, detail=why)
        elif self._shutdown.is_set() and why:
            outcome, error_code, detail = "failed", "RUNNER_HOST_STOPPED", why
        elif code == 0:
            outcome, manifest = "succeeded", self._read_manifest(child)
        else:
            outcome, error_code, detail = "failed", f"EXIT_{code}", f"the agent command exited with {code}"
        try:
            keeper.finish(outcome, error_code, detail, manifest, retries=_REPORT_RETRIES)
        except Exception as exc:
            log.error(
                "run %s: the %s report was not confirmed: %s",
                self.config.run_id,
                outcome,
                exc,
                extra=log_fields(run_id=self.config.run_id),
            )
            return HostResult(outcome, code, forced, reported=False, detail=str(exc))
        log.info(
            "run %s: reported %s (exit %s)",
            self.config.run_id,
            outcome,
            code,
            extra=log_fields(run_id=self.config.run_id),
        )
        return HostResult(outcome, code, forced, reported=True, detail=detail)

    def _read_manifest(self, child: ManagedChild) -> list[Mapping[str, Any]]:
        path = self._manifest_path(child)
        try:
            entries = json.loads(path.read_text())
        except FileNotFoundError:
            return []
        except ValueError as exc:
            log.warning(
                "run %s: manifest %s is not JSON (%s); reporting none",
                self.config.run_id,
                path,
                exc,
                extra=log_fields(run_id=self.config.run_id),
            )
            return []
        return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []

    def _hold_quarantined(self, child: ManagedChild) -> HostResult:
        """The child stays frozen and cut off for the operator; nothing is reported for it and
        nothing compensates (QUA-1). The host ends when it is stopped or the quarantine is
        cleared; either way the frozen tree is killed, never thawed to run on."""
        self._contained.wait()
        while not self._shutdown.is_set() and not self._cleared.is_set():
            self._wake.wait(_TICK_S * 4)
            self._wake.clear()
        code = child.force_stop()
        detail = "quarantine cleared" if self._cleared.is_set() else "host stopped while quarantined"
        return HostResult("quarantined", code, True, reported=False, detail=detail)

    # --- the stop request (keeper thread) and the quarantine watch (its own thread) --------------

    def _on_stop_requested(self, stop: StopRequest) -> None:
        self._stop = stop
        self._wake.set()

    def _watch(self) -> None:
        version = 0
        backoff = self._channel.backoff()
        while not self._shutdown.is_set():
            try:
                view = self._channel.poll(self.config.run_id, version, self.config.poll_wait_ms)
            except QuarantineUnavailable as exc:
                delay = backoff.next_delay()
                if backoff.attempt == 1:
                    log.warning(
                        "run %s: quarantine watch unavailable (%s); retrying",
                        self.config.run_id,
                        exc,
                        extra=log_fields(run_id=self.config.run_id),
                    )
                self._shutdown.wait(delay)
                continue
            received_at = time.monotonic()
            backoff.reset()
            version = max(version, view.version)
            if view.quarantined and not self._quarantined.is_set():
                self.quarantine = view
                self._contain(received_at)
            elif view.status == "cleared" and self._quarantined.is_set():
                log.info(
                    "run %s: quarantine cleared; the frozen child is ended",
                    self.config.run_id,
                    extra=log_fields(run_id=self.config.run_id),
                )
                self._cleared.set()
                self._wake.set()

    def _contain(self, received_at: float) -> None:
        child, keeper = self.child, self.keeper
        assert child is not None and keeper is not None
        with self._lock:
            if self._quarantined.is_set():  # the watch and a lost lease may both see it
                return
            self._quarantined.set()
            times = child.contain(received_at)
        self._wake.set()
        self._contained.set()
        log.warning(
            "run %s quarantined: frozen by %s in %.2f ms, severed by %s in %.2f ms%s",
            self.config.run_id,
            times.freezer,
            times.to_frozen_s * 1000,
            times.network,
            times.to_severed_s * 1000,
            f" ({times.error})" if times.error else "",
            extra=log_fields(run_id=self.config.run_id),
        )
        if self._on_contained is not None:
            self._on_contained(times)
        run_id = self.config.run_id
        try:
            self._stages.append(
                self._channel.report_stage(run_id, "suspended", times.freezer, times.frozen_at_wall)
            )
            self._stages.append(
                self._channel.report_stage(run_id, "severed", times.network, times.severed_at_wall)
            )
        finally:
            self._stages_done.set()
        keeper.stop()  # the lease is being revoked: no renewal, no report for a quarantined run
