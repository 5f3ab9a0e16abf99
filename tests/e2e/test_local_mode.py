"""Local mode on the real system (EXE-16): `tenure local run` runs a Run on this machine from its
downloaded lock and verified inputs and sends nothing back; `tenure local sync` is the explicit
action that claims, uploads and reports, and the run then succeeds with the verified manifest.

The CLI talks to the API through a recording proxy, so the test sees every request it sent: the
local run's are GETs only, and the run on the server is untouched (no claim, no attempt). The
proxy can also flip a byte of an input in transit: the local run refuses, and the command never
starts.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from services.command_api.routes_artifacts import artifact_id_for
from services.common.contracts.locks import digest_of, lock_problems, seal_lock
from tests.support.quarantine import QuarantineSystem, claim_run, submit_run, upload, wait_for_stage

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

RFC3339 = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
# The local "agent": reads its one input, writes it upper-cased as out.txt, and its manifest.
AGENT = """
import json, os, pathlib, sys
spec = json.loads(pathlib.Path(os.environ["TENURE_EXECUTION_SPEC"]).read_text())
source = pathlib.Path(os.environ["TENURE_ARTIFACTS_DIR"]) / spec["inputs"][0]
out = pathlib.Path(os.environ["TENURE_OUTPUT_DIR"]) / "out.txt"
out.write_bytes(source.read_bytes().upper())
manifest = [{"artifactId": "out.txt", "mediaType": "text/plain"}]
pathlib.Path(os.environ["TENURE_RESULT_MANIFEST"]).write_text(json.dumps(manifest))
assert "TENURE_CLI_API_KEY" not in os.environ and "TENURE_API_KEYS" not in os.environ
"""


class RecordingProxy:
    """Forwards every request to the API and remembers (method, path); `tamper` flips the first
    byte of every input a lock serves."""

    def __init__(self, target: str) -> None:
        self.requests: list[tuple[str, str]] = []
        self.tamper = False
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                proxy.requests.append((self.command, self.path.split("?", 1)[0]))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")
                }
                with httpx.Client(timeout=30) as http:
                    answer = http.request(self.command, target + self.path, content=body, headers=headers)
                content = answer.content
                if proxy.tamper and "/lock/artifacts/" in self.path and content:
                    content = bytes([content[0] ^ 0x20]) + content[1:]
                self.send_response(answer.status_code)
                for name, value in answer.headers.items():
                    if name.lower() not in (
                        "content-length",
                        "transfer-encoding",
                        "connection",
                        "content-encoding",
                    ):
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def writes(self) -> list[tuple[str, str]]:
        return [r for r in self.requests if r[0] != "GET"]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def system(tenure_topics: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuarantineSystem]:
    started = QuarantineSystem(tenure_topics, tmp_path_factory.mktemp("local")).start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def proxy(system: QuarantineSystem) -> Iterator[RecordingProxy]:
    recording = RecordingProxy(system.base)
    yield recording
    recording.close()


def _tenure(system: QuarantineSystem, api: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in system.env.items() if not k.startswith("TENURE_CLI_")}
    return subprocess.run(
        [sys.executable, "-m", "services.tenure_cli", "local", "--api", api, "--api-key", "sub-key", *args],
        env={**env, "TENURE_CLI_API_KEY": "sub-key"},  # the key the child must never see
        capture_output=True,
        text=True,
        timeout=60,
    )


def _run_with_input(system: QuarantineSystem, data: bytes) -> tuple[str, str, str]:
    """An input artifact (uploaded by another run of the tenant, its producer) and a run that
    names it: (run, artifact, producer)."""
    producer = submit_run(system, f"producer-{uuid.uuid4()}")
    stored = upload(system, "sub-key", claim_run(system, producer, "sub-key"), "input.txt", data)
    artifact = str(stored["artifactRef"])
    run_id = submit_run(system, f"local-{uuid.uuid4()}", {"agent": "upper", "inputs": [artifact]})
    return run_id, artifact, producer


def _server_run(system: QuarantineSystem, run_id: str) -> dict[str, Any]:
    with system.client("op-key") as client:
        view: dict[str, Any] = client.get(f"/runs/{run_id}").json()
    return view


def test_local_run_sends_nothing_back_and_sync_is_the_explicit_action_EXE_16(
    system: QuarantineSystem, proxy: RecordingProxy, tmp_path: Path
) -> None:
    data = b"hello from the input"
    run_id, artifact, _ = _run_with_input(system, data)
    with system.client("sub-key") as client:
        lock = client.get(f"/runs/{run_id}/lock").json()
    assert lock_problems(lock) == [], lock
    assert lock["artifacts"][0]["digest"] == "sha256:" + hashlib.sha256(data).hexdigest()
    with system.client("run-a") as stranger:  # not the submitter, no reader role: no bytes
        assert stranger.get(lock["artifacts"][0]["download"]).status_code == 403

    work = tmp_path / "work"
    ran = _tenure(system, proxy.url, "run", run_id, "--dir", str(work), "--", sys.executable, "-c", AGENT)
    assert ran.returncode == 0, ran.stderr + ran.stdout
    assert proxy.writes() == [], f"the local run sent writes to Tenure: {proxy.writes()}"
    assert proxy.requests == [("GET", f"/runs/{run_id}/lock"), ("GET", lock["artifacts"][0]["download"])]
    assert (work / "artifacts" / artifact).read_bytes() == data
    assert json.loads((work / "lock.json").read_text()) == lock
    result = json.loads((work / "result.json").read_text())
    out_digest = "sha256:" + hashlib.sha256(data.upper()).hexdigest()
    assert result["outcome"] == "succeeded" and result["exitCode"] == 0
    assert result["manifest"] == [
        {"artifactId": "out.txt", "digest": out_digest, "sizeBytes": len(data), "mediaType": "text/plain"}
    ]
    assert RFC3339.fullmatch(result["startedAt"]) and RFC3339.fullmatch(result["endedAt"])
    untouched = _server_run(system, run_id)
    assert untouched["status"] == "queued" and untouched["attempts"] == [] and untouched["lease"] is None

    # A lock resealed for another spec verifies locally, but the run pins the one it was
    # submitted with: sync refuses before it claims anything.
    other = tmp_path / "other"
    other.mkdir()
    (other / "outputs").mkdir()
    (other / "outputs" / "out.txt").write_bytes(data.upper())
    forged = seal_lock(run_id, "acme", None, {**lock["executionSpec"], "agent": "other"}, lock["artifacts"])
    (other / "lock.json").write_text(json.dumps(forged))
    (other / "result.json").write_text(json.dumps({**result, "lockDigest": forged["lockDigest"]}))
    refused = _tenure(system, proxy.url, "sync", str(other))
    assert refused.returncode == 1 and "nothing was sent" in refused.stderr, refused.stderr
    assert proxy.writes() == [] and _server_run(system, run_id)["attempts"] == []

    synced = _tenure(system, proxy.url, "sync", str(work))
    assert synced.returncode == 0, synced.stderr + synced.stdout
    assert [m for m, _ in proxy.writes()] == ["POST", "POST", "PUT", "POST"]  # claim, grant, bytes, report
    view = _server_run(system, run_id)
    assert view["status"] == "succeeded", view
    assert view["resultManifest"] == result["manifest"]
    with system.client("op-key") as client:
        stored = client.get(f"/artifacts/{artifact_id_for(run_id, 'out.txt')}/envelope").json()
    envelope = stored["envelope"]
    assert envelope["contentHash"] == out_digest, stored
    assert artifact in envelope["derivedFrom"], "the output is derived from the lock's input (QUA-2)"
    assert digest_of(lock["executionSpec"]) == json.loads((work / "lock.json").read_text())["specDigest"]


def test_a_tampered_input_aborts_the_local_run_before_the_command_starts_EXE_16(
    system: QuarantineSystem, proxy: RecordingProxy, tmp_path: Path
) -> None:
    run_id, _, _ = _run_with_input(system, b"trust but verify")
    marker = tmp_path / "the-command-ran"
    proxy.tamper = True
    work = tmp_path / "work"
    touch = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"
    ran = _tenure(system, proxy.url, "run", run_id, "--dir", str(work), "--", sys.executable, "-c", touch)
    assert ran.returncode == 1, ran.stderr + ran.stdout
    assert "refusing to run" in ran.stderr and "digest" in ran.stderr, ran.stderr
    assert not marker.exists(), "the command ran on an input that does not match its lock"
    assert not work.exists(), "nothing was written for a lock that does not verify"
    assert proxy.writes() == []


def test_a_tainted_input_is_never_pinned_nor_run_EXE_16_QUA_2(
    system: QuarantineSystem, tmp_path: Path
) -> None:
    run_id, artifact, producer = _run_with_input(system, b"poisoned")
    with system.client("op-key") as client:
        started = client.post(f"/runs/{producer}/quarantine", json={"reason": "poisoned", "evidence": None})
    assert started.status_code == 202, started.text
    wait_for_stage(system, producer, "taintPropagated")
    with system.client("sub-key") as client:
        refused = client.get(f"/runs/{run_id}/lock")
    assert refused.status_code == 409 and refused.json()["type"] == "/problems/artifact-quarantined", (
        refused.text
    )
    assert refused.json()["artifactId"] == artifact
    marker = tmp_path / "the-command-ran"
    touch = f"import pathlib; pathlib.Path({str(marker)!r}).write_text('ran')"
    ran = _tenure(
        system, system.base, "run", run_id, "--dir", str(tmp_path / "w"), "--", sys.executable, "-c", touch
    )
    assert ran.returncode == 1 and "artifact-quarantined" in ran.stderr, ran.stderr + ran.stdout
    assert not marker.exists()
