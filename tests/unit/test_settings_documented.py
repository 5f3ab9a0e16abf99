"""One settings source, documented (issue 11): every setting Tenure reads is a field of
`TenureSettings`, every field is in the README's configuration table, and the table names no
setting that does not exist. No module but services/common/settings.py reads the environment.
"""

from __future__ import annotations

import re
from pathlib import Path

from services.common.settings import TenureSettings
from services.lease_coordinator.domain.state import KEEPALIVE_SUMMARY_TTLS, MAX_KEEPALIVE_TTLS, LeasePolicy

REPO = Path(__file__).resolve().parents[2]


def _env_names() -> set[str]:
    names = set()
    prefix = TenureSettings.model_config.get("env_prefix", "")
    for name, field in TenureSettings.model_fields.items():
        alias = field.validation_alias
        names.add(str(alias) if isinstance(alias, str) else f"{prefix}{name}".upper())
    return names


def _documented() -> set[str]:
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("|") and "`" in line:
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", first_cell))
    return names


def test_every_setting_is_in_the_readme_table_and_nothing_else() -> None:
    fields, documented = _env_names(), _documented()
    assert fields - documented == set(), "settings missing from the README's table"
    assert documented - fields == set(), "the README documents settings that do not exist"


def test_no_module_reads_the_environment_but_settings() -> None:
    offenders = []
    for path in (REPO / "services").rglob("*.py"):
        if path.name == "settings.py" and path.parent.name == "common":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"os\.environ|os\.getenv|getenv\(", line) and not line.lstrip().startswith("#"):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_keepalive_setting_defaults_and_bounds_are_the_lease_policys() -> None:
    """Issue 16: settings.py cannot import the domain, so its field repeats two of its numbers."""
    field = TenureSettings.model_fields["lease_keepalive_fraction"]
    assert field.default == KEEPALIVE_SUMMARY_TTLS == LeasePolicy().keepalive_fraction
    bounds = {type(m).__name__: m for m in field.metadata}
    assert bounds["Ge"].ge == 0 and bounds["Le"].le == MAX_KEEPALIVE_TTLS
    LeasePolicy(keepalive_fraction=MAX_KEEPALIVE_TTLS)
