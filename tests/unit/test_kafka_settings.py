"""Production Kafka settings (issue 16): parsing, precedence, redaction, and the librdkafka -> faust
mapping of TENURE_KAFKA_CONFIG; the topic layout (prefix, partitions) of the catalog."""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from faust.auth import GSSAPICredentials, OAuthCredentials, SASLCredentials, SSLCredentials
from pydantic import ValidationError

from services.common.kafka import KafkaClientConfig, KafkaConfigError, client_config
from services.common.kafka._client_settings import load_client_config, parse_properties, resource_prefix
from services.common.kafka._config import base_config
from services.common.settings import KafkaSettings, TenureSettings
from services.common.streams._faust_client import (
    OidcTokenProvider,
    faust_broker_url,
    faust_client_options,
)

SECRET = "pa55-w0rd=with;odd"  # `=` inside a value; `;` only survives in the file form
SCRAM = {
    "security.protocol": "SASL_PLAINTEXT",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "tenure",
    "sasl.password": "pw",
}


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in ("TENURE_KAFKA_CONFIG", "TENURE_KAFKA_CONFIG_FILE", "TENURE_FAUST_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    client_config.cache_clear()
    yield monkeypatch
    client_config.cache_clear()


def test_properties_file_and_inline_settings_with_precedence(tmp_path: Path) -> None:
    file = tmp_path / "client.properties"
    file.write_text(
        "# TLS and SASL for the managed cluster\n"
        "security.protocol = SASL_SSL\n"
        "! a Java-style comment\n\n"
        f"sasl.password={SECRET}\n"
        "sasl.username=from-file\n"
    )
    settings = KafkaSettings(
        kafka_config_file=file, kafka_config="sasl.username=inline ; client.id=tenure-prod\n"
    )
    config = load_client_config(settings)
    assert config.properties == {
        "security.protocol": "SASL_SSL",
        "sasl.password": SECRET,  # split on the first `=` only
        "sasl.username": "inline",  # inline wins over the file
        "client.id": "tenure-prod",
    }


def test_secrets_are_redacted_in_reprs_and_logs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    secret = SECRET.replace(";", "")
    settings = TenureSettings(kafka_config=f"sasl.password={secret};sasl.oauthbearer.client.secret=cs")
    config = load_client_config(settings)
    logging.getLogger("tenure.test").warning("client settings %s / %r / %s", config, config, settings)
    for text in (repr(settings), str(settings), repr(config), str(config), caplog.text):
        assert secret not in text and "=cs" not in text, text
    assert config.redacted()["sasl.password"] == "***"
    assert config.redacted()["sasl.oauthbearer.client.secret"] == "***"


def test_bad_entries_fail_clearly_without_showing_values(tmp_path: Path) -> None:
    with pytest.raises(KafkaConfigError, match="entry 2") as caught:
        parse_properties("security.protocol=SSL\nhunter2-no-equals-sign", "TENURE_KAFKA_CONFIG")
    assert "hunter2" not in str(caught.value)
    for managed in ("acks=1", "enable.idempotence=false", "bootstrap.servers=x:1", "partitioner=random"):
        with pytest.raises(KafkaConfigError, match="manages itself"):
            parse_properties(managed, "TENURE_KAFKA_CONFIG")
    with pytest.raises(KafkaConfigError, match="TENURE_KAFKA_CONFIG_FILE"):
        load_client_config(KafkaSettings(kafka_config_file=tmp_path / "absent.properties"))


def test_every_confluent_client_gets_the_operator_properties_but_keeps_tenures(
    clean_env: pytest.MonkeyPatch,
) -> None:
    clean_env.setenv("TENURE_KAFKA_CONFIG", "security.protocol=SASL_SSL;client.id=quota-group")
    config = base_config("broker:9092", "tenure-command-publisher")
    assert config["security.protocol"] == "SASL_SSL"
    assert config["client.id"] == "quota-group"  # an operator's client id (quotas) wins
    assert config["bootstrap.servers"] == "broker:9092"  # KAFKA_BOOTSTRAP_SERVERS stays the one
    assert config["partitioner"] == "murmur2_random"
    clean_env.delenv("TENURE_KAFKA_CONFIG")
    client_config.cache_clear()
    assert base_config("b:1", "tenure-x")["client.id"] == "tenure-x"


def test_scram_maps_to_faust_sasl_credentials() -> None:
    options = faust_client_options(KafkaClientConfig({**SCRAM, "client.id": "tenure-prod"}))
    credentials = options["broker_credentials"]
    assert isinstance(credentials, SASLCredentials)
    assert (credentials.username, credentials.password) == ("tenure", "pw")
    assert credentials.mechanism.value == "SCRAM-SHA-512"
    assert credentials.protocol.value == "SASL_PLAINTEXT"
    assert options["broker_client_id"] == "tenure-prod"
    assert "pw" not in repr(credentials)
    plural = faust_client_options(
        KafkaClientConfig({**SCRAM, "sasl.mechanisms": "PLAIN"} | {"sasl.mechanism": ""})
    )
    assert plural["broker_credentials"].mechanism.value == "PLAIN"  # librdkafka's alias


def test_tls_settings_map_to_an_ssl_context() -> None:
    cafile = ssl.get_default_verify_paths().cafile or ssl.get_default_verify_paths().openssl_cafile
    tls = {"ssl.ca.location": cafile, "ssl.endpoint.identification.algorithm": "none"}
    options = faust_client_options(KafkaClientConfig({"security.protocol": "SSL", **tls}))
    assert isinstance(options["broker_credentials"], SSLCredentials)
    assert options["broker_credentials"].context.check_hostname is False
    sasl_ssl = faust_client_options(KafkaClientConfig({**SCRAM, "security.protocol": "SASL_SSL", **tls}))
    assert sasl_ssl["broker_credentials"].protocol.value == "SASL_SSL"
    insecure = faust_client_options(
        KafkaClientConfig({"security.protocol": "ssl", "enable.ssl.certificate.verification": "false"})
    )
    assert insecure["broker_credentials"].context.verify_mode == ssl.CERT_NONE
    with pytest.raises(KafkaConfigError, match="PKCS#12"):
        faust_client_options(
            KafkaClientConfig({"security.protocol": "SSL", "ssl.keystore.location": "k.p12"})
        )


def test_gssapi_and_plaintext_and_unknown_protocols() -> None:
    gssapi = faust_client_options(
        KafkaClientConfig({"security.protocol": "SASL_PLAINTEXT", "sasl.kerberos.service.name": "kfk"})
    )
    assert isinstance(gssapi["broker_credentials"], GSSAPICredentials)  # librdkafka's default
    assert gssapi["broker_credentials"].kerberos_service_name == "kfk"
    assert faust_client_options(KafkaClientConfig({})) == {}
    with pytest.raises(KafkaConfigError, match=r"security\.protocol"):
        faust_client_options(KafkaClientConfig({"security.protocol": "TLS"}))
    with pytest.raises(KafkaConfigError, match=r"sasl\.username"):
        faust_client_options(KafkaClientConfig({**SCRAM, "sasl.username": ""}))


def test_oauthbearer_oidc_maps_to_a_token_provider_that_caches() -> None:
    oidc = {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "OAUTHBEARER",
        "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "tenure",
        "sasl.oauthbearer.client.secret": "cs",
        "sasl.oauthbearer.token.endpoint.url": "https://idp.example/token",
        "sasl.oauthbearer.scope": "kafka",
    }
    options = faust_client_options(KafkaClientConfig(oidc))
    assert isinstance(options["broker_credentials"], OAuthCredentials)
    assert "cs" not in repr(options["broker_credentials"].oauth_cb)
    calls: list[httpx.Request] = []

    def idp(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200, json={"access_token": f"tok-{len(calls)}", "expires_in": 300})

    provider = OidcTokenProvider(
        "https://idp.example/token", "tenure", "cs", "kafka", transport=httpx.MockTransport(idp)
    )

    async def twice() -> list[str]:
        return [await provider.token(), await provider.token()]

    assert asyncio.run(twice()) == ["tok-1", "tok-1"]
    assert len(calls) == 1 and b"grant_type=client_credentials" in calls[0].content
    assert calls[0].headers["authorization"].startswith("Basic ")
    with pytest.raises(KafkaConfigError, match="oidc"):
        faust_client_options(KafkaClientConfig({**oidc, "sasl.oauthbearer.method": "default"}))


def test_faust_extras_parse_as_json_and_may_not_replace_tenures(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("TENURE_FAUST_CONFIG", "broker_max_poll_records=500; broker_client_rack=eu-1a")
    options = faust_client_options(client_config())
    assert options == {"broker_max_poll_records": 500, "broker_client_rack": "eu-1a"}
    with pytest.raises(KafkaConfigError, match="consumer_group_instance_id"):
        faust_client_options(KafkaClientConfig({}, {"consumer_group_instance_id": "x"}))
    assert faust_broker_url("a:1, b:2") == "kafka://a:1;kafka://b:2"


def test_min_insync_replicas_may_not_exceed_the_replication_factor() -> None:
    with pytest.raises(ValidationError, match="exceeds"):
        KafkaSettings(topic_replication_factor=2, topic_min_insync_replicas=3)
    assert (
        KafkaSettings(topic_replication_factor=3, topic_min_insync_replicas=2).topic_min_insync_replicas == 2
    )
    with pytest.raises(ValidationError):
        KafkaSettings(topic_prefix="no spaces/or slashes")


def test_a_prefixed_layout_applies_to_every_catalog_topic_and_keeps_families_equal() -> None:
    probe = (
        "import json, services.common.topics as t, services.common.routing as r;"
        "from services.common.kafka import resource_prefix;"
        "from services.tenure_cli.topic_tools import resolve_topic, DEFAULT_TAIL_TOPICS;"
        "specs = [v for v in vars(t).values() if isinstance(v, t.TopicSpec)];"
        "print(json.dumps({'names': [s.name for s in specs], 'catalog': len(t.TOPICS), 'all': len(specs),"
        " 'parts': {s.name: s.partitions for s in specs}, 'prefix': resource_prefix(),"
        " 'tail': list(DEFAULT_TAIL_TOPICS), 'resolved': resolve_topic('runs.events'),"
        " 'route': r.partition_for_run.__defaults__ == (8,) == r.partition_for_endpoint.__defaults__}))"
    )
    env = {"TENURE_TOPIC_PREFIX": "prod-eu.", "TENURE_TOPIC_PARTITIONS": "8", "PATH": "/usr/bin:/bin"}
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, cwd=root)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["catalog"] == seen["all"], "a TopicSpec is missing from TOPICS"
    assert all(n.startswith("prod-eu.") for n in seen["names"]), seen["names"]
    assert all(n.startswith("prod-eu.") for n in seen["tail"])
    assert seen["resolved"] == "prod-eu.runs.events" and seen["prefix"] == "prod-eu."
    single = {"prod-eu.tenure.deadletter", "prod-eu.tenure.policy", "prod-eu.tenure.incidents"}
    assert {n: p for n, p in seen["parts"].items() if n not in single} == dict.fromkeys(
        set(seen["names"]) - single, 8
    )
    assert seen["route"]
    assert resource_prefix() == ""  # this process: no prefix
