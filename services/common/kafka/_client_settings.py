"""The operator's Kafka client properties (TLS, SASL, OAUTHBEARER, client ids), from TenureSettings.

One source for every client Tenure creates: librdkafka's own property names, taken from
TENURE_KAFKA_CONFIG_FILE (a properties file, the natural home of a mounted secret) and then
TENURE_KAFKA_CONFIG (inline; a key set there wins over the file). confluent-kafka clients get them
as they are (services/common/kafka/_config.py); the faust workers get them translated to faust's
names (services/common/streams/_faust_client.py). Properties Tenure decides itself (acks,
idempotence, transactions, isolation, groups, the partitioner) are refused at start-up: a
deployment that weakened them would silently lose the guarantees docs/architecture.md promises.

No module imports confluent_kafka here: the streams adapter uses this parsing too.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.common.settings import KafkaSettings

__all__ = [
    "MANAGED_PROPERTIES",
    "KafkaClientConfig",
    "KafkaConfigError",
    "client_config",
    "is_secret_property",
    "load_client_config",
    "parse_properties",
    "resource_prefix",
]

# What Tenure sets per client for its correctness (docs/architecture.md "Production Kafka").
MANAGED_PROPERTIES = frozenset(
    {
        "bootstrap.servers",  # KAFKA_BOOTSTRAP_SERVERS: one place for the address
        "metadata.broker.list",
        "acks",
        "request.required.acks",
        "enable.idempotence",
        "transactional.id",
        "transaction.timeout.ms",
        "isolation.level",
        "group.id",
        "group.instance.id",
        "enable.auto.commit",
        "enable.auto.offset.store",
        "auto.offset.reset",
        "enable.partition.eof",
        "partitioner",  # co-partitioning needs Java's murmur2 in every client
    }
)
_KEY = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_REDACTED = "***"


class KafkaConfigError(ValueError):
    """The operator's Kafka client settings cannot be used; the message says which and why."""


def is_secret_property(key: str) -> bool:
    """Passwords, client secrets, inline private keys and the free-form OAUTHBEARER config."""
    return (
        "password" in key or "secret" in key or key in {"ssl.key.pem", "sasl.oauthbearer.config", "ssl_key"}
    )


def parse_properties(text: str, source: str, *, semicolons: bool = False) -> dict[str, str]:
    """`key=value` lines (blank lines and `#`/`!` comments skipped; whitespace around both trimmed).

    Error messages name the source and line but never a value: a value may be a password."""
    entries = re.split(r"[\n;]" if semicolons else r"\n", text)
    out: dict[str, str] = {}
    for number, raw in enumerate(entries, start=1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            # The text itself is not shown: a line without `=` may be half of a password.
            raise KafkaConfigError(f"{source} entry {number} is not `key=value`")
        if key in MANAGED_PROPERTIES:
            raise KafkaConfigError(
                f"{source} sets {key}, which Tenure manages itself (see docs/architecture.md "
                '"Production Kafka"); remove it'
            )
        out[key] = value.strip()
    return out


@dataclass(frozen=True)
class KafkaClientConfig:
    """librdkafka properties for every client, plus faust-only extras; repr never shows a secret."""

    properties: Mapping[str, str] = field(default_factory=dict, repr=False)
    faust_settings: Mapping[str, Any] = field(default_factory=dict, repr=False)

    def redacted(self) -> dict[str, str]:
        return {k: _REDACTED if is_secret_property(k) else v for k, v in self.properties.items()}

    def __repr__(self) -> str:
        return f"KafkaClientConfig(properties={self.redacted()}, faust_settings={dict(self.faust_settings)})"

    __str__ = __repr__

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    @property
    def security_protocol(self) -> str:
        return (self.properties.get("security.protocol") or "plaintext").upper()

    @property
    def sasl_mechanism(self) -> str:
        # librdkafka's alias pair; its default mechanism is GSSAPI.
        value = self.properties.get("sasl.mechanism") or self.properties.get("sasl.mechanisms")
        return (value or "GSSAPI").upper()


def _faust_settings(text: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for number, raw in enumerate(re.split(r"[\n;]", text), start=1):
        line = raw.strip()
        if not line or line[0] == "#":
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not re.match(r"^[a-z][a-z0-9_]*$", key):
            raise KafkaConfigError(f"TENURE_FAUST_CONFIG entry {number} is not `setting=value`")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def load_client_config(settings: KafkaSettings) -> KafkaClientConfig:
    properties: dict[str, str] = {}
    file: Path | None = settings.kafka_config_file
    if file is not None:
        try:
            text = file.read_text()
        except OSError as exc:
            raise KafkaConfigError(f"TENURE_KAFKA_CONFIG_FILE {file}: {exc.strerror}") from None
        properties.update(parse_properties(text, f"TENURE_KAFKA_CONFIG_FILE {file}"))
    inline = settings.kafka_config.get_secret_value()
    properties.update(parse_properties(inline, "TENURE_KAFKA_CONFIG", semicolons=True))
    return KafkaClientConfig(properties, _faust_settings(settings.faust_config))


@functools.cache
def client_config() -> KafkaClientConfig:
    """This process's client settings, read once (every client of the process shares them)."""
    return load_client_config(KafkaSettings())


@functools.cache
def resource_prefix() -> str:
    """TENURE_TOPIC_PREFIX, which also prefixes the cluster-wide ids Tenure chooses (consumer
    groups, transactional ids): two deployments sharing a cluster must not fence each other."""
    return KafkaSettings().topic_prefix
