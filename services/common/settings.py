"""Deployment settings, read from the environment (TENURE_* and KAFKA_BOOTSTRAP_SERVERS)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from services.common.heap import CollectorSchedule

__all__ = ["KafkaSettings", "TenureSettings", "child_environment", "repo_root", "schema_dir_override"]


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def child_environment(**overrides: str) -> dict[str, str]:
    """The environment for a child process: this one's, with `overrides` (the only other place
    the environment is touched: children read their settings through TenureSettings too)."""
    return {**os.environ, **overrides}


def schema_dir_override() -> Path | None:
    """TENURE_SCHEMA_DIR (the `schema_dir` setting), read per call without building the settings:
    the Avro codec asks on every encode, and tests point it at a directory of their own."""
    value = os.environ.get("TENURE_SCHEMA_DIR")
    return Path(value) if value else None


class KafkaSettings(BaseSettings):
    """Production Kafka (docs/architecture.md "Production Kafka"): client settings and topic layout.

    A base of TenureSettings, and usable alone: the topic catalog reads it once at import (names
    and partition counts are module constants used everywhere) without the rest of the settings."""

    model_config = SettingsConfigDict(env_prefix="TENURE_", extra="ignore")

    # Secret-bearing (sasl.password, ssl.key.password, ...): a SecretStr, so no repr shows it.
    kafka_config: SecretStr = Field(
        default=SecretStr(""),
        description="librdkafka client properties, `key=value` one per line (or `;`-separated), "
        "e.g. security.protocol, ssl.*, sasl.*; applied to every Kafka client; overrides the file.",
    )
    kafka_config_file: Path | None = Field(
        default=None, description="A librdkafka properties file (`key=value` lines, # comments)."
    )
    faust_config: str = Field(
        default="",
        max_length=10_000,
        description="Extra faust App settings for the stream processors, `key=value;...` "
        "(values parsed as JSON when they are, e.g. broker_max_poll_records=500).",
    )
    topic_prefix: str = Field(
        default="",
        pattern=r"^[A-Za-z0-9._-]{0,100}$",
        description='Prefix of every Tenure topic name, e.g. "prod." (one cluster, many deployments).',
    )
    topic_partitions: int = Field(
        default=4, ge=1, le=10_000, description="Partitions of every keyed topic family (co-partitioned)."
    )
    topic_replication_factor: int = Field(
        default=1, ge=1, le=32, description="Replication factor of the topics Tenure creates."
    )
    topic_min_insync_replicas: int | None = Field(
        default=None, ge=1, le=32, description="min.insync.replicas of Tenure's topics; unset = broker's."
    )

    @model_validator(mode="after")
    def _insync_within_replicas(self) -> KafkaSettings:
        if (self.topic_min_insync_replicas or 0) > self.topic_replication_factor:
            raise ValueError(
                f"TENURE_TOPIC_MIN_INSYNC_REPLICAS={self.topic_min_insync_replicas} exceeds "
                f"TENURE_TOPIC_REPLICATION_FACTOR={self.topic_replication_factor}: no write could succeed"
            )
        return self


class TenureSettings(KafkaSettings):
    model_config = SettingsConfigDict(env_prefix="TENURE_", extra="ignore")

    kafka_bootstrap_servers: str | None = Field(
        default=None,
        validation_alias="KAFKA_BOOTSTRAP_SERVERS",
        description="Kafka to use; when unset, the broker started by `tenure broker start`.",
    )
    state_dir: Path = Field(default_factory=lambda: repo_root() / ".tenure")
    schema_dir: Path | None = Field(default=None, description="Avro schemas; default <repo>/schemas.")
    # --- the wire format (services/common/avro/_registry.py; docs "Interoperability") ---
    wire_format: Literal["single-object", "confluent"] = Field(
        default="single-object", description="What producers write; readers accept both formats."
    )
    schema_registry_url: str = Field(
        default="",
        max_length=2000,
        description="Confluent-compatible API base (Apicurio: http://host:8080/apis/ccompat/v7).",
    )
    schema_registry_username: str = Field(default="", description="HTTP basic auth; empty = none.")
    schema_registry_password: SecretStr = Field(default=SecretStr(""), description="Never logged or shown.")
    schema_registry_timeout_s: float = Field(default=5.0, gt=0, le=60, description="Per registry call.")

    @model_validator(mode="after")
    def _confluent_needs_a_registry(self) -> TenureSettings:
        if self.wire_format == "confluent" and not self.schema_registry_url:
            raise ValueError("TENURE_WIRE_FORMAT=confluent needs TENURE_SCHEMA_REGISTRY_URL")
        return self

    instance_id: str = Field(default="0", description="Stable per process: static group membership.")
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    decision_timeout_s: float = Field(default=5.0, gt=0, le=60)
    api_brief_cache_runs: int = Field(
        default=100_000,
        ge=0,
        le=10_000_000,
        description="Decoded Run briefs an API instance keeps in memory for heartbeats (about 1.5 kB "
        "each); 0: read each from its views store (services/projections/brief_cache.py).",
    )
    api_shed_after_ms: int = Field(
        default=2_000,
        ge=0,
        le=60_000,
        description="Admission control: while a batch renewal this API instance waits for has "
        "waited longer, new batch renewals are refused with 503 and Retry-After, unpublished; "
        "0: never (services/command_api/lease_batch.py).",
    )
    session_timeout_s: float = Field(default=10.0, ge=6, le=300)
    # How long a processor waits for more commands before deciding a batch: longer carries more
    # commands per Kafka transaction (less CPU each). 5 ms gave ~19% more workflows/s than 1 ms
    # at 8 clients and no measurable change at one (docs/benchmarks.md, durable steps).
    batch_window_ms: float = Field(default=5.0, ge=0.1, le=100.0)
    # A batch taken from a backlog is split into transactions of at most this many bytes of
    # commands, so the first command waits for its part, not for the whole backlog (issue 16).
    # 256 KiB, not 64: each part pays a transaction's wait, and with 64 KiB parts a backlog of
    # batch renewals at 100,000 live leases could not drain (docs/architecture.md).
    batch_max_bytes: int = Field(default=262_144, ge=1_024, le=16 * 1024 * 1024)
    # The Run's state changelog written by a unit at most this often per partition instead of in
    # every transaction: one partition fewer per transaction, and a restore from the changelog
    # folds the events of up to this long (services/common/aggregate/changelog_lag.py). 0: every
    # unit writes it.
    changelog_every_ms: int = Field(default=0, ge=0, le=600_000)
    gc_young_interval_ms: float = Field(
        default=100.0,
        ge=0,
        le=10_000,
        description="A service's cyclic collector runs a young pass this often; 0: CPython's own "
        "count-based schedule (services/common/heap.py).",
    )
    gc_middle_every: int = Field(
        default=10,
        ge=1,
        le=1_000,
        description="With the collector on a clock, every this-many-th pass collects the middle "
        "generation too (1: every pass, so a survivor is walked once before the old generation).",
    )
    gc_full_interval_s: int = Field(
        default=3_600,
        ge=0,
        le=86_400,
        description="With the collector on a clock, a full pass (it walks every live object) this "
        "often; 0: never.",
    )
    log_level: str = "INFO"
    access_log: bool = Field(default=False, description="HTTP access log lines (JSON), every HTTP process.")
    http_shutdown_grace_s: int = Field(
        default=10,
        ge=0,
        le=3600,
        description="After SIGTERM, how long an HTTP process finishes requests before cutting them.",
    )
    lease_seconds: int = Field(default=90, ge=1, le=3600, description="Default lease TTL (EXE-4).")
    heartbeat_seconds: int = Field(default=20, ge=1, le=1800, description="Default heartbeat interval.")
    lease_at_risk_fraction: float = Field(default=0.5, gt=0, lt=1)
    lease_keepalive_fraction: float = Field(
        # LeasePolicy's KEEPALIVE_SUMMARY_TTLS and MAX_KEEPALIVE_TTLS (test_settings_documented.py).
        default=40.0,
        ge=0,
        le=1000,
        allow_inf_nan=False,
        description="A renewal stays off runs.events (on runs.renewals) while the lease's last renewal "
        "there is younger than this many TTLs (40: an hour at the default 90 s lease); 0: every "
        "renewal on runs.events (issue 16).",
    )
    timer_interval_s: float = Field(default=0.1, gt=0, le=5)
    stop_grace_seconds: float = Field(
        default=30, gt=0, le=3600, description="How long a runner has to confirm a cancel or deadline stop."
    )
    auto_retry: bool = Field(
        default=True, description="Organisation policy: automatic retries allowed (EXE-5)."
    )
    max_queued_per_tenant: int = Field(
        default=0, ge=0, description="EXE-2 queue places per tenant; 0 = no limit."
    )
    max_active_per_tenant: int = Field(
        default=0, ge=0, description="EXE-2 active slots per tenant; 0 = no limit."
    )
    tenant_limits: str = Field(default="", description='Per-tenant overrides, "acme=10:2,beta=100:20".')
    framework_log_level: str = Field(default="WARNING", description="Log level of faust itself.")
    # --- who may call: API keys and the key Tenure's own processes present to each other ---
    api_keys: str = Field(
        default="",
        description='"key=principal:role,..."; empty = development mode (every caller is anonymous).',
    )
    service_key: str = Field(
        default="",
        description="The API key Tenure's own processes (saga orchestrator) present; its principal "
        "must have the service role in TENURE_API_KEYS.",
    )
    # --- the `tenure` CLI's commands that go through the API (tenure breakers) ---
    cli_api_url: str = Field(
        default="", description="The API the CLI talks to; empty = http://<api host>:<api port>."
    )
    cli_api_key: str = Field(
        default="", description="The API key the CLI presents (an operator's, for breaker overrides)."
    )
    # --- HTTP limits ---
    max_body_bytes: int = Field(
        default=1_048_576, ge=1024, le=64 * 1_048_576, description="Largest request body (413 above)."
    )
    # --- the effect gateway and its tools ---
    gateway_port: int = Field(default=8200, ge=1, le=65535)
    gateway_url: str = Field(default="http://127.0.0.1:8200", description="Where the saga sends effects.")
    tools: str = Field(
        default="ledger=http://127.0.0.1:9100", description='The gateway\'s tools, "name=url,...".'
    )
    tool_timeout_s: float = Field(default=5.0, gt=0, le=300, description="Gateway timeout per tool call.")
    tool_egress: str = Field(
        default="",
        max_length=10_000,
        description='Per tool egress allowlist (QUA-1): "tool=host|*.domain,..."; a tool not listed '
        "declares none.",
    )
    saga_workers: int = Field(default=16, ge=1, le=512, description="Saga effects in flight at once.")
    tool_catalog: Path | None = Field(
        default=None, description="Tool registrations (SAGA-2); default: the sim environment's."
    )
    # --- the reference external systems (a fenced ledger, a simulated world for the saga's tools) ---
    ledger_port: int = Field(default=9100, ge=1, le=65535)
    ledger_host: str = Field(default="127.0.0.1", description="0.0.0.0 inside a container.")
    ledger_db: Path | None = Field(default=None, description="Default: <state dir>/fenced_ledger.sqlite3.")
    ledger_faults: bool = Field(default=False, description="Serve the ledger's fault-injection routes.")
    sim_port: int = Field(default=9200, ge=1, le=65535)
    sim_host: str = Field(default="127.0.0.1", description="0.0.0.0 inside a container.")
    sim_time_scale: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="1 = the seed's nominal tool durations."
    )
    # --- readiness/metrics ports of the processes that serve no API of their own ---
    coordinator_health_port: int = Field(default=8301, ge=0, le=65535, description="0 = off")
    projections_health_port: int = Field(default=8302, ge=0, le=65535, description="0 = off")
    saga_health_port: int = Field(default=8303, ge=0, le=65535, description="0 = off")
    watchdog_health_port: int = Field(default=8304, ge=0, le=65535, description="0 = off")
    # --- the semantic watchdog's deployment thresholds (WD-2..WD-5; bounds as in
    # services/watchdog/domain/thresholds.py BOUNDS; a run may override them within the same) ---
    watchdog_max_period: int = Field(default=8, ge=1, le=32, description="K: longest cycle period.")
    watchdog_window: int = Field(default=32, ge=2, le=256, description="State hashes kept (> K).")
    watchdog_epoch_steps: int = Field(default=6, ge=2, le=100, description="E: stagnation epoch.")
    watchdog_repeat_count: int = Field(default=1, ge=1, le=10, description="Repeats of a failing action.")
    watchdog_rollback_budget: int = Field(default=1, ge=0, le=5, description="Level-2 rollbacks per run.")
    watchdog_ladder_epoch: int = Field(default=3, ge=1, le=10, description="Steps within which to escalate.")
    watchdog_poll_patience: int = Field(default=5, ge=1, le=100, description="Unchanged polls tolerated.")
    # --- the fleet-wide circuit breakers (BRK-1, BRK-2; services/breakers) ---
    breakers_health_port: int = Field(default=8305, ge=0, le=65535, description="0 = off")
    quarantine_health_port: int = Field(default=8306, ge=0, le=65535, description="0 = off")
    # --- schedules (EXE-14; services/schedules) ---
    schedules_health_port: int = Field(default=8307, ge=0, le=65535, description="0 = off")
    schedules_clock_offset_file: Path | None = Field(
        default=None,
        description="Tests and drills only: a file holding milliseconds added to the schedules "
        "processor's clock (re-read when it changes); unset = the system clock.",
    )
    breaker_window: int = Field(default=20, ge=20, le=1000, description="W: outcomes in the ring (>= 20).")
    breaker_min_calls: int = Field(default=10, ge=1, le=1000, description="Calls before the rate counts.")
    breaker_failure_rate: float = Field(default=0.5, ge=0.5, le=0.7, description="tau_fail: above it, open.")
    # The spec's T_cooldown is 30-120 s; shorter values exist for tests and demos.
    breaker_cooldown_ms: int = Field(default=30_000, ge=500, le=600_000, description="T_cooldown, the first.")
    breaker_cooldown_max_ms: int = Field(default=120_000, ge=500, le=3_600_000, description="T_cooldown_max.")
    breaker_slow_call_ms: int = Field(default=0, ge=0, le=600_000, description="Slower calls fail; 0 = off.")
    breaker_canary_lease_ms: int = Field(default=15_000, ge=100, le=600_000, description="Canary slot lease.")
    # --- bulkheads per tool domain (BRK-4; services/common/bulkhead.py): concurrency, queue, timeout ---
    bulkhead_local_concurrency: int = Field(default=64, ge=1, le=1024)
    bulkhead_local_queue: int = Field(default=64, ge=0, le=10_000)
    bulkhead_local_timeout_ms: int = Field(default=500, ge=1, le=500, description="Local tools: <= 500 ms.")
    bulkhead_internal_concurrency: int = Field(default=32, ge=1, le=1024)
    bulkhead_internal_queue: int = Field(default=64, ge=0, le=10_000)
    bulkhead_internal_timeout_ms: int = Field(default=2_000, ge=1, le=60_000)
    bulkhead_external_concurrency: int = Field(default=16, ge=1, le=1024)
    bulkhead_external_queue: int = Field(default=16, ge=0, le=10_000)
    bulkhead_external_timeout_ms: int = Field(default=5_000, ge=1, le=300_000)
    bulkhead_default_domain: Literal["local", "internal", "external"] = Field(
        default="external", description="The domain of a tool bulkhead_tools does not name."
    )
    bulkhead_tools: str = Field(
        default="",
        max_length=10_000,
        description='Per tool: "tool=domain[:concurrency/queue/timeout_ms],...", e.g. "env=internal".',
    )
    # --- the bundled broker (services.common.broker; `tenure up` when KAFKA_BOOTSTRAP_SERVERS is unset) ---
    kafka_port: int | None = Field(
        default=None, ge=1, le=65535, description="The bundled broker's listener port; unset = a free one."
    )
    kafka_cache: Path | None = Field(
        default=None, description="Folder of the bundled broker's jars; unset = .cache/kafka/<version>/libs."
    )
    kafka_jvm_opts: str = Field(
        default="", description="JVM flags (shell words) replacing the bundled broker's defaults."
    )
    java_home: Path | None = Field(
        default=None, validation_alias="JAVA_HOME", description="The Java to run it; unset = `java` on PATH."
    )
    # --- the managed runner host (services/runner_host; QUA-1, EXE-7) ---
    runner_host_health_port: int = Field(default=8308, ge=0, le=65535, description="0 = off")
    runner_host_id: str = Field(
        default="rh0",
        pattern=r"^[A-Za-z0-9_-]{1,40}$",
        description="Unique per live host: names its cgroups/netns, and start-up removes stale ones.",
    )
    runner_host_api_url: str = Field(
        default="", description="The API the host talks to; empty = http://<api host>:<api port>."
    )
    runner_host_api_key: str = Field(
        default="", description="The runner's own API key (runner role): claims, heartbeats, stage reports."
    )
    runner_host_stop_grace_s: float = Field(
        default=10.0, gt=0, le=3600, description="EXE-7: SIGTERM to SIGKILL of a cancelled child."
    )
    runner_host_freezer: Literal["auto", "cgroup-v2-freeze", "cgroup-v1-freezer", "sigstop"] = Field(
        default="auto", description="Suspension mechanism; auto = the best one the probe finds."
    )
    runner_host_network: Literal["auto", "netns", "none"] = Field(
        default="auto", description="auto/netns = own namespace + veth where possible; none = host network."
    )
    # --- several instances of one processor (issue 16; services/common/process.py) ---
    instance_port_stride: int = Field(
        default=100,
        ge=0,
        le=1000,
        description="A numeric TENURE_INSTANCE_ID n serves health on its port + n * stride (0 = same port).",
    )
    # Off for a lone instance, on for several (issue 16): `tenure up --instances N` (N > 1) and the
    # compose file turn it on unless the operator set it. One instance needs no generation check
    # (each incarnation re-takes the same transactional id, fencing the last one), and the check
    # measured about half the durable-step throughput (docs/benchmarks.md, durable steps).
    group_fence: bool = Field(
        default=False,
        description="Commit each batch's command offsets in its transaction under the group generation "
        "(KIP-447), so an owner the group evicted cannot commit; needed with several instances of a "
        "processor (docs/architecture.md, the generation fence).",
    )

    # --- the artifact object store (EXE-15; services/common/objectstore): filesystem or S3 ---
    object_store: Literal["filesystem", "s3"] = Field(
        default="filesystem", description="Where artifacts live: <state dir>/artifacts, or an S3 bucket."
    )
    s3_bucket: str = Field(default="", max_length=63, description="The bucket (TENURE_OBJECT_STORE=s3).")
    s3_endpoint_url: str = Field(
        default="", max_length=2000, description="An S3-compatible server; empty = AWS's own endpoint."
    )
    s3_region: str = Field(default="", max_length=64, description="Empty = boto3's default chain.")
    s3_access_key_id: str = Field(default="", description="Empty = boto3's default credential chain.")
    s3_secret_access_key: SecretStr = Field(default=SecretStr(""), description="Never logged or shown.")
    s3_session_token: SecretStr = Field(default=SecretStr(""), description="Temporary credentials only.")
    s3_key_prefix: str = Field(
        default="", max_length=200, description='Every object\'s name starts with it ("tenure/" ...).'
    )
    s3_addressing_style: Literal["auto", "path", "virtual"] = Field(
        default="auto", description="auto = path style with an endpoint URL, virtual-hosted on AWS."
    )
    s3_timeout_s: float = Field(default=5.0, gt=0, le=60, description="Connect and read timeout per call.")
    s3_max_attempts: int = Field(default=3, ge=1, le=10, description="Tries per call (boto3 standard).")

    # --- tracing (issue 17; services/common/tracing.py): OpenTelemetry, off by default ---
    otel_exporter: str = Field(
        default="none",
        pattern=r"^(none|otlp|console|file:.+)$",
        max_length=1000,
        description="Where finished spans go: none (off), otlp (OTLP/HTTP to TENURE_OTEL_ENDPOINT), "
        "console, or file:<path> (one JSON line per span). Trace context propagates either way.",
    )
    otel_endpoint: str = Field(
        default="",
        max_length=2000,
        description="The OTLP/HTTP traces endpoint, e.g. http://127.0.0.1:4318/v1/traces; empty: the "
        "exporter's default (OTEL_EXPORTER_OTLP_ENDPOINT, else localhost:4318).",
    )
    otel_export_timeout_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="How long an OTLP export (retries included) may take: a collector that is away "
        "delays only the exporter's thread, and a process's exit by at most this.",
    )
    otel_service_name: str = Field(
        default="", max_length=200, description="service.name of this process's spans; empty: its module."
    )

    def parsed_tenant_limits(self) -> dict[str, tuple[int, int]]:
        limits: dict[str, tuple[int, int]] = {}
        for item in filter(None, (p.strip() for p in self.tenant_limits.split(","))):
            tenant, _, pair = item.partition("=")
            queued, _, active = pair.partition(":")
            if not tenant or not queued.isdigit() or not active.isdigit():
                raise ValueError(f"TENURE_TENANT_LIMITS entry {item!r} is not tenant=queued:active")
            limits[tenant] = (int(queued), int(active))
        return limits

    def ledger_database(self) -> Path:
        return self.ledger_db or self.state_dir / "fenced_ledger.sqlite3"

    def collector_schedule(self) -> CollectorSchedule:
        """When this process's cyclic collector passes run (services/common/heap.py)."""
        return CollectorSchedule(
            young_interval_s=self.gc_young_interval_ms / 1000,
            middle_every=self.gc_middle_every,
            full_interval_s=self.gc_full_interval_s,
        )

    def bootstrap_servers(self) -> str:
        if self.kafka_bootstrap_servers:
            return self.kafka_bootstrap_servers
        from services.common.broker import resolve_bootstrap

        return resolve_bootstrap()
