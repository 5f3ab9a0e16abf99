"""`tenure local run|sync`: run a Run on this machine from its lock; sync back only when asked (EXE-16).

    tenure local run RUN [--dir D] -- COMMAND...   download the lock and its inputs, verify, run
    tenure local sync D [--runner-id R]             claim, upload the outputs, report (explicit)

`run` reads only: GET /runs/RUN/lock and GET each input its lock pins (the read is recorded in
the tenant's provenance graph, QUA-2, as every artifact read is; the run itself is untouched).
It checks the lock's specDigest and lockDigest (services.common.contracts.locks) and every
input's sha256 and size before anything runs: any mismatch aborts with the reason, exit 1, and
the command is never started. Then, in D:

    lock.json      the lock as downloaded          spec.json   its executionSpec
    artifacts/     the verified inputs, by id      outputs/    where the command writes results
    manifest.json  the command's ResultManifest    result.json outcome, exit code, manifest, times

The command runs as the runner host runs its child (services/runner_host/host.py): this
environment without any TENURE_* or KAFKA_* variable (so never the CLI's API key), plus
TENURE_RUN_ID, TENURE_EXECUTION_SPEC, TENURE_ARTIFACTS_DIR, TENURE_OUTPUT_DIR,
TENURE_RESULT_MANIFEST and TENURE_LOCAL_MODE=1. Its manifest is a JSON list of
{artifactId, mediaType} (digest and sizeBytes optional), one per file outputs/<artifactId>; the
digest and size recorded are the file's own, and a declared one that differs fails the run.
Exit 0 with a verified manifest is `succeeded`, anything else `failed`; `run` exits with the
command's exit code (1 when a zero exit's manifest does not verify).

`sync` is the one action that writes: it re-verifies D (the lock's digests, every output's
bytes against result.json), refuses if the run's current lock pins another specDigest, then
claims the run through the runner SDK (TenureClient.claim), uploads each output under an upload
grant of that attempt (derived from the lock's inputs, QUA-2), and reports the outcome with the
manifest (TenureClient.report), where the service verifies the stored objects (EXE-1/EXE-15).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from services.common.contracts.locks import bytes_digest, lock_problems
from services.common.settings import TenureSettings, child_environment
from services.runner_sdk.client import TenureClient, api_http_client
from services.tenure_cli.api_client import add_api_options, api_target, call

__all__ = [
    "LocalModeError",
    "add_parser",
    "child_env",
    "local_run",
    "local_sync",
    "output_manifest",
    "split_run_arguments",
    "verified_bytes",
]

_CHUNK = 1 << 16


class LocalModeError(RuntimeError):
    """Local mode refuses: the reason is printed and the CLI exits 1."""


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _api(args: argparse.Namespace) -> tuple[str, str]:
    """The API base URL and key, resolved as every API command resolves them."""
    return api_target(args)


def verified_bytes(entry: Mapping[str, Any], data: bytes) -> bytes:
    """`data` if it is the artifact the lock pins (sha256 and size); LocalModeError otherwise."""
    found = bytes_digest(data)
    if found != entry.get("digest"):
        raise LocalModeError(
            f"artifact {entry.get('artifactId')}: downloaded bytes have digest {found}, the lock "
            f"pins {entry.get('digest')}; refusing to run"
        )
    if len(data) != entry.get("sizeBytes"):
        raise LocalModeError(
            f"artifact {entry.get('artifactId')}: downloaded {len(data)} bytes, the lock pins "
            f"{entry.get('sizeBytes')}; refusing to run"
        )
    return data


def _verified_lock(lock: Any, run_id: str | None = None) -> dict[str, Any]:
    problems = lock_problems(lock)
    if not problems and run_id is not None and lock.get("runId") != run_id:
        problems = [f"the lock is run {lock.get('runId')}'s, not {run_id}'s"]
    if problems:
        raise LocalModeError("the lock does not verify: " + "; ".join(problems) + "; refusing to run")
    return dict(lock)


def child_env(base: Mapping[str, str], run_dir: Path, run_id: str) -> dict[str, str]:
    """The command's environment: `base` without TENURE_* / KAFKA_* (no key leaks), plus its paths."""
    kept = {k: v for k, v in base.items() if not k.startswith(("TENURE_", "KAFKA_"))}
    return {
        **kept,
        "TENURE_LOCAL_MODE": "1",
        "TENURE_RUN_ID": run_id,
        "TENURE_EXECUTION_SPEC": str(run_dir / "spec.json"),
        "TENURE_ARTIFACTS_DIR": str(run_dir / "artifacts"),
        "TENURE_OUTPUT_DIR": str(run_dir / "outputs"),
        "TENURE_RESULT_MANIFEST": str(run_dir / "manifest.json"),
    }


def _output_path(outputs: Path, artifact_id: Any) -> Path:
    if not isinstance(artifact_id, str) or not artifact_id or len(artifact_id) > 256:
        raise LocalModeError(f"manifest entry artifactId {str(artifact_id)[:80]!r} is not a name")
    path = (outputs / artifact_id).resolve()
    if outputs.resolve() not in path.parents:
        raise LocalModeError(f"manifest entry {artifact_id[:80]!r} is not a file under {outputs}")
    return path


def _file_digest(path: Path) -> tuple[str, int]:
    sha, size = hashlib.sha256(), 0
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return "sha256:" + sha.hexdigest(), size


def output_manifest(declared: Any, outputs: Path) -> list[dict[str, Any]]:
    """The ResultManifest of what the command declared, each entry's digest and size the file's
    own (outputs/<artifactId>); LocalModeError for a missing file or a declared value that differs."""
    if not isinstance(declared, list):
        raise LocalModeError("the ResultManifest is not a JSON list")
    manifest: list[dict[str, Any]] = []
    for entry in declared:
        if not isinstance(entry, Mapping):
            raise LocalModeError(f"manifest entry {str(entry)[:80]} is not an object")
        path = _output_path(outputs, entry.get("artifactId"))
        if not path.is_file():
            raise LocalModeError(f"manifest entry {entry['artifactId']!r}: no file {path}")
        digest, size = _file_digest(path)
        for name, actual in (("digest", digest), ("sizeBytes", size)):
            if name in entry and entry[name] != actual:
                raise LocalModeError(
                    f"manifest entry {entry['artifactId']!r}: declared {name} {entry[name]!r}, "
                    f"the file has {actual!r}"
                )
        media_type = entry.get("mediaType", "application/octet-stream")
        manifest.append(
            {"artifactId": entry["artifactId"], "digest": digest, "sizeBytes": size, "mediaType": media_type}
        )
    return manifest


def _download(http: httpx.Client, base: str, entry: Mapping[str, Any]) -> bytes:
    url = base.rstrip("/") + str(entry.get("download"))
    try:
        response = http.get(url)
    except httpx.TransportError as exc:
        raise LocalModeError(f"cannot download {entry.get('artifactId')}: {exc}") from exc
    if response.status_code != 200:
        raise LocalModeError(
            f"artifact {entry.get('artifactId')}: HTTP {response.status_code} {response.text[:300]}"
        )
    return verified_bytes(entry, response.content)


def _run_options(parser: argparse.ArgumentParser, top: bool) -> None:
    default: Any = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--dir", default=default, help="the local run's directory (default ./tenure-local-RUN)"
    )


def split_run_arguments(args: argparse.Namespace) -> tuple[str, list[str]]:
    """RUN and COMMAND from `RUN [options] -- COMMAND...`; the options land on `args`.

    argparse alone cannot tell options after RUN from the command's own (a REMAINDER takes both,
    a `*` positional is matched empty beside RUN), so what follows RUN is split at the first `--`
    and the part before it parsed here; everything after it is the command, untouched."""
    rest = list(args.rest or ())
    head, command = (rest[: rest.index("--")], rest[rest.index("--") + 1 :]) if "--" in rest else (rest, [])
    if not head or not command:
        raise LocalModeError(
            "usage: tenure local run RUN [--dir D] -- COMMAND... (the command goes after --)"
        )
    options = argparse.ArgumentParser(prog="tenure local run", add_help=False, exit_on_error=False)
    add_api_options(options, top=False)
    _run_options(options, top=False)
    try:
        options.parse_args(head[1:], namespace=args)
    except (argparse.ArgumentError, SystemExit) as exc:
        raise LocalModeError(f"tenure local run: {exc}") from None
    return head[0], command


def local_run(args: argparse.Namespace) -> int:
    """Download, verify, run. Nothing is sent back (EXE-16): only GETs reach the API."""
    run_id, command = split_run_arguments(args)
    lock = _verified_lock(call(args, "GET", f"/runs/{quote(run_id, safe='')}/lock"), run_id)
    base, key = _api(args)
    # Every input is downloaded and verified before a file is written or the command starts.
    inputs: list[tuple[str, bytes]] = []
    with api_http_client(key or None, TenureSettings().decision_timeout_s + 5.0) as http:
        for entry in lock["artifacts"]:
            inputs.append((str(entry["artifactId"]), _download(http, base, entry)))
    run_dir = Path(args.dir or f"tenure-local-{run_id}")
    for sub in ("artifacts", "outputs"):
        (run_dir / sub).mkdir(parents=True, exist_ok=True)
    (run_dir / "lock.json").write_text(json.dumps(lock, indent=2, ensure_ascii=False))
    (run_dir / "spec.json").write_text(json.dumps(lock["executionSpec"], indent=2, ensure_ascii=False))
    for artifact_id, data in inputs:
        (run_dir / "artifacts" / artifact_id).write_bytes(data)
    manifest_path = run_dir / "manifest.json"
    manifest_path.unlink(missing_ok=True)  # a manifest of an earlier local run is not this one's
    started = _now()
    try:
        code = subprocess.run(
            command, env=child_env(child_environment(), run_dir, run_id), check=False
        ).returncode
    except OSError as exc:
        raise LocalModeError(f"cannot start {command[0]!r}: {exc}") from exc
    result: dict[str, Any] = {
        "runId": run_id,
        "lockDigest": lock["lockDigest"],
        "specDigest": lock["specDigest"],
        "command": command,
        "exitCode": code,
        "startedAt": started,
        "endedAt": _now(),
        "outcome": "failed",
        "errorCode": f"EXIT_{code}",
        "detail": f"the command exited with {code}",
        "manifest": None,
    }
    if code == 0:
        try:
            declared = json.loads(manifest_path.read_text()) if manifest_path.exists() else []
            result["manifest"] = output_manifest(declared, run_dir / "outputs")
            result.update(outcome="succeeded", errorCode="", detail="")
        except (ValueError, LocalModeError) as exc:
            result.update(errorCode="MANIFEST_INVALID", detail=f"the ResultManifest does not verify: {exc}")
    (run_dir / "result.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
    print(
        f"{run_id}: {result['outcome']} (exit {code}); results in {run_dir} (not synced: tenure local sync)"
    )
    return 0 if result["outcome"] == "succeeded" else (code if 0 < code < 256 else 1)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as exc:
        raise LocalModeError(f"{path} is missing: is this a `tenure local run` directory?") from exc
    except ValueError as exc:
        raise LocalModeError(f"{path} is not JSON: {exc}") from exc


def _upload(
    http: httpx.Client,
    base: str,
    attempt: Mapping[str, Any],
    entry: Mapping[str, Any],
    data: bytes,
    derived_from: Sequence[str],
) -> None:
    grant_body = {
        "leaseEpoch": attempt["epoch"],
        "destination": entry["artifactId"],
        "maxBytes": max(1, len(data)),
        "mediaType": entry["mediaType"],
    }
    grant = http.post(f"{base}/attempts/{quote(attempt['attemptId'], safe='')}/uploads", json=grant_body)
    if grant.status_code != 201:
        raise LocalModeError(
            f"upload grant for {entry['artifactId']}: HTTP {grant.status_code} {grant.text[:300]}"
        )
    params = {"derivedFrom": list(derived_from)} if derived_from else None
    stored = http.put(base + grant.json()["uploadUrl"], content=data, params=params)
    if stored.status_code != 201:
        raise LocalModeError(
            f"upload of {entry['artifactId']}: HTTP {stored.status_code} {stored.text[:300]}"
        )
    if stored.json().get("digest") != entry["digest"]:
        raise LocalModeError(f"upload of {entry['artifactId']}: stored {stored.json().get('digest')}")


def local_sync(args: argparse.Namespace) -> int:
    """The explicit action: claim, upload the outputs, report the outcome with its manifest."""
    run_dir = Path(args.dir)
    lock = _verified_lock(_read_json(run_dir / "lock.json"))
    result = _read_json(run_dir / "result.json")
    run_id = str(lock["runId"])
    if not isinstance(result, Mapping) or result.get("lockDigest") != lock["lockDigest"]:
        raise LocalModeError(f"{run_dir / 'result.json'} is not the result of this lock; nothing was sent")
    manifest = result.get("manifest") or []
    outputs: list[tuple[dict[str, Any], bytes]] = []
    for entry in manifest:
        try:
            data = _output_path(run_dir / "outputs", entry.get("artifactId")).read_bytes()
        except OSError as exc:
            raise LocalModeError(f"output {entry.get('artifactId')}: {exc}; nothing was sent") from exc
        if bytes_digest(data) != entry.get("digest"):
            raise LocalModeError(
                f"output {entry.get('artifactId')} changed since the local run; nothing was sent"
            )
        outputs.append((dict(entry), data))
    current = call(args, "GET", f"/runs/{quote(run_id, safe='')}/lock")
    pinned = current.get("specDigest") if isinstance(current, Mapping) else None
    if pinned != lock["specDigest"]:
        raise LocalModeError(
            f"run {run_id} now pins spec {pinned}, the local run ran {lock['specDigest']}; nothing was sent"
        )
    base, key = _api(args)
    timeout_s = TenureSettings().decision_timeout_s + 5.0
    with TenureClient(base, base, api_key=key or None, timeout_s=timeout_s) as client:
        lease = client.claim(run_id, args.runner_id, [])
        attempt = {"attemptId": lease.attempt_id, "epoch": lease.epoch}
        with api_http_client(key or None, timeout_s) as http:
            for entry, data in outputs:
                _upload(
                    http, base.rstrip("/"), attempt, entry, data, [a["artifactId"] for a in lock["artifacts"]]
                )
        view = client.report(
            lease,
            1,  # the attempt's first message after its claim: no renewal came before it
            "succeeded" if result.get("outcome") == "succeeded" else "failed",
            str(result.get("errorCode") or ""),
            str(result.get("detail") or "")[:4000],
            manifest=manifest if result.get("outcome") == "succeeded" else None,
        )
    synced = {
        "runId": run_id,
        "attemptId": lease.attempt_id,
        "status": view.get("status"),
        "syncedAt": _now(),
    }
    (run_dir / "sync.json").write_text(json.dumps(synced, indent=2))
    print(f"{run_id}: synced as attempt {lease.attempt_id}; the run is {view.get('status')}")
    # The service has the last word (EXE-1): a local success whose manifest it refuses is failed.
    return 0 if view.get("status") == result.get("outcome") else 1


def add_parser(sub: Any) -> None:
    local = sub.add_parser(
        "local", help="run a Run on this machine from its lock; sync back explicitly (EXE-16)"
    )
    add_api_options(local, top=True)
    verbs = local.add_subparsers(dest="verb", required=True)
    run = verbs.add_parser(
        "run", help="download the lock and verified inputs, run COMMAND; sends nothing back"
    )
    add_api_options(run, top=False)
    _run_options(run, top=True)
    run.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        metavar="RUN [--dir D] -- COMMAND...",
        help="the run, then its command",
    )
    run.set_defaults(func=local_run)
    sync = verbs.add_parser("sync", help="claim the run, upload the local results and report them")
    add_api_options(sync, top=False)
    sync.add_argument("dir", metavar="D")
    sync.add_argument("--runner-id", default="tenure-local", help="the holder the claim names")
    sync.set_defaults(func=local_sync)
