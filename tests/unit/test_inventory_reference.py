"""The schema is the one reference: docs/inventory.md's tables are generated from it and
current, and every role argument spec that defaults to a fleet_* variable agrees with the
schema on that variable's type, choices and default."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils import schema

ROOT = Path(__file__).resolve().parents[2]
SPECS = sorted(ROOT.glob("roles/*/meta/argument_specs.yml"))
# An option's default that reads one fleet variable, with an optional literal default.
_READS = re.compile(r"^\{\{ (fleet_[a-z_]+)(?: \| default\((?:'([^']*)'|(\w+))\))? \}\}$")
# The argument spec type each kind of schema field is read as.
_TYPES = {schema.Integer: "int", schema.Number: "float", schema.Boolean: "bool",
          schema.Path: "path"}


def _reference():
    spec = importlib.util.spec_from_file_location(
        "inventory_reference", ROOT / "scripts" / "inventory_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_inventory_page_shows_every_variable_as_the_schema_has_it():
    reference = _reference()
    page = (ROOT / "docs" / "inventory.md").read_text()
    assert reference.current(page) == page, "run scripts/inventory_reference.py"
    for name in [*schema.BOX_FIELDS, *schema.ROLE_FIELDS, *schema.CLIENT_KEY_FIELDS]:
        assert f"| `{name}` |" in page, name


def _options():
    for path in SPECS:
        for entry, spec in yaml.safe_load(path.read_text())["argument_specs"].items():
            for option, fields in spec.get("options", {}).items():
                match = _READS.match(str(fields.get("default", "")))
                if match:
                    yield pytest.param(fields, match, id=f"{path.parts[-3]}.{entry}.{option}")


@pytest.mark.parametrize(("option", "reads"), list(_options()))
def test_an_argument_spec_that_reads_a_fleet_variable_agrees_with_the_schema(option, reads):
    name, text_default, word_default = reads.groups()
    field = schema.BOX_FIELDS[name]
    assert option["type"] == _TYPES.get(type(field.kind), "str")
    if isinstance(field.kind, schema.Choice):
        assert option["choices"] == list(field.kind.names)
    literal = text_default if text_default is not None else word_default
    # An empty text default stands for "unset": the role derives the value (the schema's
    # default says how).
    if literal and field.default.startswith("`"):
        assert f"`{literal}`" == field.default
