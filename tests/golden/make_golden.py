"""Writes golden single-object samples for every schema version; run by hand, never by tests.

    python tests/golden/make_golden.py

For each `<RecordName>.v<N>.avsc` under schemas/ it writes `<RecordName>.v<N>.bin` (the bytes
that version's writer produces) and `<RecordName>.v<N>.json` (what was written), from the fixed
values below. JSON keys keep the written order: Avro writes map entries in insertion order, so
the .json must replay that order to re-encode the same bytes. Existing goldens are never
rewritten: they pin what is already on the log, and test_schema_evolution.py must keep
decoding them forever. Adding a schema version means adding its sample here and running this
script once; to replace a golden, delete it on purpose first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GOLDEN_DIR = Path(__file__).resolve().parent
REPO_ROOT = GOLDEN_DIR.parents[1]
sys.path.insert(0, str(REPO_ROOT))

from services.common.avro import SchemaRegistry  # noqa: E402  (needs the sys.path line above)

sys.path.insert(0, str(GOLDEN_DIR))

# The sample values, one module per aggregate's records.
import golden_breakers  # noqa: E402
import golden_quarantine  # noqa: E402
import golden_runs  # noqa: E402
import golden_schedules  # noqa: E402
from golden_saga import saga_sample  # noqa: E402

SAMPLES: dict[tuple[str, int], dict[str, Any]] = {
    **golden_runs.SAMPLES,
    **golden_breakers.SAMPLES,
    **golden_schedules.SAMPLES,
    **golden_quarantine.SAMPLES,
}


def main() -> int:
    registry = SchemaRegistry.from_directory(REPO_ROOT / "schemas")
    for name in registry.names():
        for v in registry.versions(name):
            if v.full_name.startswith(("tenure.trajectories.", "tenure.incidents.", "tenure.watchdog.")):
                SAMPLES.setdefault((v.full_name, v.version), saga_sample(v.declared))
    missing = [
        f"{v.full_name} v{v.version}"
        for name in registry.names()
        for v in registry.versions(name)
        if (v.full_name, v.version) not in SAMPLES
    ]
    if missing:
        print("no sample values for: " + ", ".join(missing), file=sys.stderr)
        return 1
    for (full_name, version), record in sorted(SAMPLES.items()):
        schema = registry.get(full_name, version)
        stem = f"{full_name.rsplit('.', 1)[1]}.v{version}"
        bin_path, json_path = GOLDEN_DIR / f"{stem}.bin", GOLDEN_DIR / f"{stem}.json"
        if bin_path.exists() or json_path.exists():
            print(f"kept    {bin_path.name} (goldens are never rewritten)")
            continue
        bin_path.write_bytes(registry.encode(full_name, record, version=version))
        expectation = {
            "schema": full_name,
            "version": version,
            "fingerprint": schema.fingerprint_hex,
            # Schema field order reads best; it does not change the encoding of a record.
            "record": {f["name"]: record[f["name"]] for f in schema.declared["fields"]},
        }
        json_path.write_text(
            json.dumps(expectation, indent=2, ensure_ascii=False) + "\n",
            encoding="utf-8",
        )
        print(f"wrote   {bin_path.name} + {json_path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
