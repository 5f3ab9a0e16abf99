"""A throw-away certificate authority for TLS tests: a CA, a broker and a client certificate
(SAN IP:127.0.0.1), made with the openssl command line, PEM files only."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: Path
    broker_keystore: Path  # PKCS#8 key + certificate, Kafka's ssl.keystore.type=PEM
    client_cert: Path
    client_key: Path

    def broker_properties(self) -> dict[str, str]:
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.broker_keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.client.auth": "required",  # mutual TLS: the client's certificate is checked too
        }


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
        "-days", "2", "-subj", "/CN=tenure-test-ca", cwd=folder,
    )  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for name in ("broker", "client"):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN=tenure-test-{name}", cwd=folder,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", "san.ext", cwd=folder,
        )  # fmt: skip
    keystore = folder / "broker.keystore.pem"
    keystore.write_text((folder / "broker.key").read_text() + (folder / "broker.crt").read_text())
    return Pki(folder / "ca.pem", keystore, folder / "client.crt", folder / "client.key")
