"""The gateway bench's --before: another revision's gateway, run beside this one in one run."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def gateway_bench():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("gateway_bench")
    finally:
        sys.path.remove(str(BENCH))


def test_a_revisions_gateway_is_written_where_it_runs_from(gateway_bench, tmp_path: Path):
    gateway_dir = gateway_bench.gateway_of_revision("HEAD", tmp_path / "before")

    committed = subprocess.run(["git", "-C", str(BENCH.parent), "show", "HEAD:gateway/"
                                "lobes_gateway/__main__.py"], capture_output=True, check=True)
    assert (gateway_dir / "lobes_gateway" / "__main__.py").read_bytes() == committed.stdout
    # the package imports the contract through a link into plugins/module_utils
    assert (gateway_dir / "lobes_contract.py").resolve().is_file()


def test_before_adds_its_target_and_still_writes_the_docs_section(gateway_bench):
    settings = gateway_bench.parse_args(["--before", "HEAD"])

    assert settings.targets == (*gateway_bench.TARGETS, "before")
    assert settings.before == "HEAD"
    assert settings.write_docs


def test_a_revision_this_checkout_does_not_have_is_refused_before_anything_runs(
        gateway_bench, capsys):
    with pytest.raises(SystemExit):
        gateway_bench.parse_args(["--before", "no-such-revision-here"])

    assert "--before no-such-revision-here: not a revision of this checkout" in \
        capsys.readouterr().err
