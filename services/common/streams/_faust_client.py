"""The operator's librdkafka client properties, translated to faust/aiokafka's settings.

The processors consume with faust (aiokafka) and write with confluent-kafka; both must reach the
same cluster with the same security. The source is one (TENURE_KAFKA_CONFIG[_FILE], librdkafka
names, services/common/kafka/_client_settings.py); this module maps what aiokafka can express:

  security.protocol              -> the credentials' protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
  sasl.mechanism(s)              -> PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, GSSAPI, OAUTHBEARER
  sasl.username / sasl.password  -> SASLCredentials
  sasl.kerberos.service.name     -> GSSAPICredentials
  sasl.oauthbearer.method=oidc and .client.id/.client.secret/.token.endpoint.url/.scope
                                 -> OAuthCredentials with a client-credentials token provider
  ssl.ca.location / ssl.ca.pem, ssl.certificate.location, ssl.key.location, ssl.key.password,
  ssl.endpoint.identification.algorithm, enable.ssl.certificate.verification -> an SSLContext
  client.id                      -> broker_client_id

A property that changes how the client authenticates but that aiokafka cannot honour (a PKCS#12
keystore, inline certificates, librdkafka's unsecured-JWT OAUTHBEARER) is an error at start-up,
never silently dropped: the worker would otherwise connect differently from the writers. Other
librdkafka tuning properties (linger.ms, statistics...) apply to confluent-kafka clients only;
faust settings of their own come from TENURE_FAUST_CONFIG.
"""

from __future__ import annotations

import ssl
import time
from pathlib import Path
from typing import Any

import httpx
from aiokafka.abc import AbstractTokenProvider
from faust.auth import GSSAPICredentials, OAuthCredentials, SASLCredentials, SSLCredentials

from services.common.kafka import KafkaClientConfig, KafkaConfigError

__all__ = ["FAUST_MANAGED_SETTINGS", "OidcTokenProvider", "faust_broker_url", "faust_client_options"]

# Set by the stream runtime from Tenure's own settings; TENURE_FAUST_CONFIG may not replace them.
FAUST_MANAGED_SETTINGS = frozenset(
    {
        "id",
        "broker",
        "broker_credentials",
        "ssl_context",
        "store",
        "datadir",
        "topic_allow_declare",
        "topic_disable_leader",
        "consumer_group_instance_id",
        "broker_session_timeout",
        "broker_heartbeat_interval",
        "broker_commit_interval",
        "consumer_auto_offset_reset",
        "processing_guarantee",
        "web_enabled",
        "autodiscover",
    }
)
_UNSUPPORTED = {
    "ssl.keystore.location": "a PKCS#12 keystore; give ssl.certificate.location and ssl.key.location (PEM)",
    "ssl.certificate.pem": "an inline certificate; give ssl.certificate.location (a PEM file)",
    "ssl.key.pem": "an inline private key; give ssl.key.location (a PEM file)",
    "ssl.engine.location": "an OpenSSL engine",
    "ssl.providers": "OpenSSL providers",
}
_TRUE = {"true", "1", "yes", "on"}


def faust_broker_url(bootstrap_servers: str) -> str:
    """faust's form of a bootstrap list: `kafka://h1:p1;kafka://h2:p2` (it does not split commas)."""
    hosts = [h.strip() for h in bootstrap_servers.split(",") if h.strip()]
    return ";".join(f"kafka://{h.removeprefix('kafka://')}" for h in hosts)


def _ssl_context(config: KafkaClientConfig) -> ssl.SSLContext:
    for key, why in _UNSUPPORTED.items():
        if config.get(key):
            raise KafkaConfigError(f"{key} is set, but the faust workers cannot use {why}")
    ca = config.get("ssl.ca.location")
    cafile = capath = None
    if ca and ca != "probe":
        cafile, capath = (None, ca) if Path(ca).is_dir() else (ca, None)
    context = ssl.create_default_context(cafile=cafile, capath=capath, cadata=config.get("ssl.ca.pem"))
    certificate = config.get("ssl.certificate.location")
    if certificate:
        context.load_cert_chain(
            certificate, config.get("ssl.key.location") or None, config.get("ssl.key.password") or None
        )
    if (config.get("ssl.endpoint.identification.algorithm") or "https").lower() == "none":
        context.check_hostname = False
    if (config.get("enable.ssl.certificate.verification") or "true").lower() not in _TRUE:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


class OidcTokenProvider(AbstractTokenProvider):  # type: ignore[misc]  # aiokafka is untyped
    """OAuth 2 client credentials (librdkafka's sasl.oauthbearer.method=oidc), token cached
    until shortly before it expires."""

    def __init__(
        self,
        token_url: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._url = token_url
        self._auth = (client_id, client_secret)
        self._scope = scope
        self._transport = transport
        self._token: str | None = None
        self._expires_at = 0.0

    def __repr__(self) -> str:  # never the secret
        return f"OidcTokenProvider(url={self._url!r}, client_id={self._auth[0]!r})"

    async def token(self) -> str:
        if self._token is not None and time.monotonic() < self._expires_at:
            return self._token
        form = {"grant_type": "client_credentials", **({"scope": self._scope} if self._scope else {})}
        async with httpx.AsyncClient(timeout=10.0, transport=self._transport) as client:
            response = await client.post(self._url, data=form, auth=self._auth)
        if response.status_code != 200:
            raise KafkaConfigError(f"OAUTHBEARER token endpoint {self._url}: HTTP {response.status_code}")
        body = response.json()
        self._token = str(body["access_token"])
        # Refresh at 80% of the lifetime, as librdkafka does.
        self._expires_at = time.monotonic() + 0.8 * float(body.get("expires_in", 300))
        return self._token


def _oauth(config: KafkaClientConfig, context: ssl.SSLContext | None) -> OAuthCredentials:
    if (config.get("sasl.oauthbearer.method") or "default").lower() != "oidc":
        raise KafkaConfigError(
            "OAUTHBEARER for the faust workers needs sasl.oauthbearer.method=oidc (librdkafka's "
            "default method issues unsecured test tokens only)"
        )
    needed = ("token.endpoint.url", "client.id", "client.secret")
    missing = [f"sasl.oauthbearer.{k}" for k in needed if not config.get(f"sasl.oauthbearer.{k}")]
    if missing:
        raise KafkaConfigError(f"OAUTHBEARER (oidc) needs {', '.join(missing)}")
    provider = OidcTokenProvider(
        str(config.get("sasl.oauthbearer.token.endpoint.url")),
        str(config.get("sasl.oauthbearer.client.id")),
        str(config.get("sasl.oauthbearer.client.secret")),
        config.get("sasl.oauthbearer.scope"),
    )
    return OAuthCredentials(oauth_cb=provider, ssl_context=context)


def faust_client_options(config: KafkaClientConfig) -> dict[str, Any]:
    """Keyword settings for faust.App: credentials, client id, and TENURE_FAUST_CONFIG's extras."""
    options: dict[str, Any] = {}
    client_id = config.get("client.id")
    if client_id:
        options["broker_client_id"] = client_id
    protocol = config.security_protocol
    context = _ssl_context(config) if protocol in {"SSL", "SASL_SSL"} else None
    if protocol == "SSL":
        options["broker_credentials"] = SSLCredentials(context)
    elif protocol in {"SASL_PLAINTEXT", "SASL_SSL"}:
        mechanism = config.sasl_mechanism
        if mechanism in {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}:
            if not config.get("sasl.username") or config.get("sasl.password") is None:
                raise KafkaConfigError(f"SASL {mechanism} needs sasl.username and sasl.password")
            options["broker_credentials"] = SASLCredentials(
                username=config.get("sasl.username"),
                password=config.get("sasl.password"),
                ssl_context=context,
                mechanism=mechanism,
            )
        elif mechanism == "GSSAPI":
            options["broker_credentials"] = GSSAPICredentials(
                kerberos_service_name=config.get("sasl.kerberos.service.name") or "kafka",
                ssl_context=context,
            )
        elif mechanism == "OAUTHBEARER":
            options["broker_credentials"] = _oauth(config, context)
        else:
            raise KafkaConfigError(f"sasl.mechanism {mechanism} is not one faust/aiokafka supports")
    elif protocol != "PLAINTEXT":
        raise KafkaConfigError(
            f"security.protocol {protocol} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
        )
    clashing = sorted(FAUST_MANAGED_SETTINGS & set(config.faust_settings))
    if clashing:
        raise KafkaConfigError(f"TENURE_FAUST_CONFIG sets {', '.join(clashing)}, which Tenure manages itself")
    options.update(config.faust_settings)
    return options
