"""Pinned models: the lock file read and written (hostile input refused with one error naming
file, key path and fix), where each gear's revision comes from, the disk check's arithmetic and
the box-to-box fill rounds."""

from __future__ import annotations

import pytest
import yaml
from ansible_collections.lobes.fleet.plugins.module_utils import models
from ansible_collections.lobes.fleet.plugins.module_utils.errors import FleetErrors
from ansible_collections.lobes.fleet.plugins.module_utils.models import (
    GIB,
    FleetLock,
    LockedFile,
    LockError,
    disk_shortfalls,
    dump_lock,
    fill_rounds,
    model_pins,
    model_summary,
    parse_lock,
    pin_findings,
    rounds_needed,
    with_image,
    with_model,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.modules import model_lock, model_plan
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.mesh import seed_mesh
from tests.unit.modules import run_module

REV_A = "0123456789abcdef0123456789abcdef01234567"
REV_B = "89abcdef0123456789abcdef0123456789abcdef"
SHA = "ab" * 32
SOURCE = "inventories/prod/fleet.lock.yml"
EXAMPLE = f"""\
# Written by lobes.fleet (playbooks/models.yml, site.yml); review and commit it. docs/operations.md
version: 1
models:
  Qwen/Qwen3.5-4B:
    revision: {REV_A}
    files:
      config.json: {{size: 1234, sha256: {SHA}}}
images:
  nvcr.io/nvidia/vllm:26.01-py3: sha256:{SHA}
"""


def _refusal(text: str) -> LockError:
    with pytest.raises(LockError) as caught:
        parse_lock(text, SOURCE)
    return caught.value


# ---------------------------------------------------------------- the lock file


def test_the_documented_example_reads_and_writes_back_as_written():
    lock = parse_lock(EXAMPLE, SOURCE)
    assert lock.model("Qwen/Qwen3.5-4B").revision == REV_A
    assert dict(lock.model("Qwen/Qwen3.5-4B").files) == {"config.json": LockedFile(1234, SHA)}
    assert lock.image("nvcr.io/nvidia/vllm:26.01-py3") == f"sha256:{SHA}"
    assert dump_lock(lock) == EXAMPLE


def test_an_empty_lock_writes_empty_tables_and_reads_back():
    text = dump_lock(FleetLock())
    assert text.splitlines()[1:] == ["version: 1", "models: {}", "images: {}"]
    assert parse_lock(text, SOURCE) == FleetLock()


def _entry(**changes) -> str:
    model = {"revision": REV_A, "files": {"config.json": {"size": 1, "sha256": SHA}}}
    model.update(changes)
    return yaml.safe_dump({"version": 1, "models": {"Qwen/Qwen3.5-4B": model}})


def _file(name="config.json", **changes) -> str:
    item = {"size": 1, "sha256": SHA, **changes}
    return _entry(files={name: item})


@pytest.mark.parametrize(("text", "path", "words"), [
    ("version: 2\n", "version", "not 1"),
    ("version: true\n", "version", "not 1"),
    ("models: {}\n", "version", "is missing"),
    ("version: 1\nmodles: {}\n", "modles", "did you mean 'models'"),
    ("version: 1\nmodels: []\n", "models", "not a mapping"),
    (_entry(revision="0123456789ABCDEF0123456789ABCDEF01234567"),
     'models["Qwen/Qwen3.5-4B"].revision', "40 lowercase hex"),
    (_entry(revision=REV_A[:-1]), 'models["Qwen/Qwen3.5-4B"].revision', "40 lowercase hex"),
    (_entry(revison=REV_A), 'models["Qwen/Qwen3.5-4B"].revison', "did you mean 'revision'"),
    (_file(sha256="ab" * 31), 'models["Qwen/Qwen3.5-4B"].files["config.json"].sha256',
     "64 lowercase hex"),
    (_file(size=-1), 'models["Qwen/Qwen3.5-4B"].files["config.json"].size', "whole number"),
    (_file(size=True), 'models["Qwen/Qwen3.5-4B"].files["config.json"].size', "whole number"),
    (_file(size=1.5), 'models["Qwen/Qwen3.5-4B"].files["config.json"].size', "whole number"),
    (_file(sha265=SHA), 'models["Qwen/Qwen3.5-4B"].files["config.json"].sha265',
     "did you mean 'sha256'"),
    (_file("../config.json"), 'models["Qwen/Qwen3.5-4B"].files["../config.json"]', "'..'"),
    (_file("/etc/passwd"), 'models["Qwen/Qwen3.5-4B"].files["/etc/passwd"]', "absolute"),
    (_file("a\\b"), 'models["Qwen/Qwen3.5-4B"].files["a\\\\b"]', "backslash"),
    (_file("a\x00b"), 'models["Qwen/Qwen3.5-4B"].files["a\\u0000b"]', "control"),
    (_file("a\nb"), 'models["Qwen/Qwen3.5-4B"].files["a\\nb"]', "control"),
    (_file("a//b"), 'models["Qwen/Qwen3.5-4B"].files["a//b"]', "empty"),
    (yaml.safe_dump({"version": 1, "models": {"Qwen": {"revision": REV_A, "files": {}}}}),
     'models["Qwen"]', "org/name"),
    (yaml.safe_dump({"version": 1, "models": {"a/b/c": {"revision": REV_A, "files": {}}}}),
     'models["a/b/c"]', "org/name"),
    (yaml.safe_dump({"version": 1, "models": {"org/x..y": {"revision": REV_A, "files": {}}}}),
     'models["org/x..y"]', "org/name"),
    (yaml.safe_dump({"version": 1, "images": {"vllm:1": "sha256:" + "ab" * 31}}),
     'images["vllm:1"]', "sha256:<64"),
    (yaml.safe_dump({"version": 1, "images": {"vllm:1": SHA}}), 'images["vllm:1"]', "sha256:"),
    (yaml.safe_dump({"version": 1, "images": {"vllm 1": f"sha256:{SHA}"}}), 'images["vllm 1"]',
     "image reference"),
    (yaml.safe_dump({"version": 1, "images": {"": f"sha256:{SHA}"}}), 'images[""]',
     "image reference"),
    ("version: 1\nversion: 1\n", '"version"', "written twice"),
    ("version: &v 1\nmodels: {a: *v}\n", "the file", "alias"),
    ("version: 1\nmodels: {\n", "the file", "not YAML"),
    ("version: 2001-13-45\n", "the file", "not YAML"),
    ("", "the file", "empty, not a mapping"),
])
def test_a_refused_lock_names_the_file_the_key_path_and_the_fix(text, path, words):
    error = _refusal(text)
    assert str(error).startswith(f"{SOURCE}: {path}: ")
    assert words in str(error)
    assert error.fix and error.fix in str(error)


# Values the lock file takes, drawn wide: the round trip must hold for all of them.
_HUB_CHAR = st.sampled_from("abcXYZ019._-")
_HUB_PART = st.builds(lambda first, middle, last: first + middle + last,
                      st.sampled_from("aZ9"), st.text(_HUB_CHAR, max_size=6),
                      st.sampled_from("bY0")).filter(lambda s: ".." not in s and "--" not in s)
_CHECKPOINT = st.builds(lambda org, name: f"{org}/{name}", _HUB_PART, _HUB_PART)
_HEX40 = st.text("0123456789abcdef", min_size=40, max_size=40)
_HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
_PATH_PART = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl",
                                                         "Zp"), blacklist_characters="/\\"),
                     min_size=1, max_size=8).filter(lambda s: s not in (".", "..")
                                                    and s.isprintable())
_FILE_PATH = st.lists(_PATH_PART, min_size=1, max_size=3).map("/".join)
_FILES = st.dictionaries(_FILE_PATH, st.builds(LockedFile, st.integers(0, 2 ** 70), _HEX64),
                         max_size=4)
_IMAGE = st.text(st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp",
                                                     "Zs")), min_size=1, max_size=30)


@st.composite
def _locks(draw) -> FleetLock:
    lock = FleetLock()
    for checkpoint, (revision, files) in draw(st.dictionaries(
            _CHECKPOINT, st.tuples(_HEX40, _FILES), max_size=3)).items():
        lock = with_model(lock, checkpoint, revision, files)
    for ref, digest in draw(st.dictionaries(_IMAGE, _HEX64, max_size=3)).items():
        lock = with_image(lock, ref, f"sha256:{digest}")
    return lock


@settings(max_examples=200, deadline=None)
@given(_locks())
def test_any_lock_written_reads_back_as_itself(lock):
    text = dump_lock(lock)
    assert text.startswith(models.LOCK_HEADER + "\n")
    assert parse_lock(text, SOURCE) == lock
    assert dump_lock(parse_lock(text, SOURCE)) == text


def _garbage_values():
    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
    return st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(st.text(max_size=12) | st.integers(), inner,
                                          max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_any_text_is_read_or_refused_with_the_one_error(text):
    try:
        parse_lock(text, SOURCE)
    except LockError as error:
        assert str(error).startswith(SOURCE)


@settings(max_examples=300, deadline=None)
@given(_garbage_values(), st.sampled_from(["top", "models", "model", "files", "file"]))
def test_any_structure_is_read_or_refused_with_the_one_error(value, where):
    data = {"top": value,
            "models": {"version": 1, "models": value},
            "model": {"version": 1, "models": {"Qwen/Qwen3.5-4B": value}},
            "files": {"version": 1, "models": {"Qwen/Qwen3.5-4B": {"revision": REV_A,
                                                                   "files": value}}},
            "file": {"version": 1, "models": {"Qwen/Qwen3.5-4B": {
                "revision": REV_A, "files": {"config.json": value}}}}}[where]
    try:
        lock = parse_lock(yaml.safe_dump(data), SOURCE)
    except LockError as error:
        assert str(error).startswith(SOURCE)
    else:
        assert parse_lock(dump_lock(lock), SOURCE) == lock


def test_the_longest_names_written_with_every_character_escaped_read_back():
    longest = '"' * models.MAX_TEXT
    lock = with_image(with_model(FleetLock(), "Qwen/Qwen3.5-4B", REV_A,
                                 {longest: LockedFile(1, SHA)}), longest, f"sha256:{SHA}")
    assert parse_lock(dump_lock(lock), SOURCE) == lock
    with pytest.raises(LockError, match="at most 400"):
        with_model(lock, "Qwen/Qwen3.5-4B", REV_A, {longest + "x": LockedFile(1, SHA)})


def test_with_model_replaces_an_entry_and_checks_what_it_is_given():
    lock = with_model(FleetLock(), "Qwen/Qwen3.5-4B", REV_A, {"a.json": {"size": 1, "sha256": SHA}})
    lock = with_model(lock, "Qwen/Qwen3.5-4B", REV_B, {"b.json": LockedFile(2, SHA)})
    replaced = models.LockedModel(REV_B, (("b.json", LockedFile(2, SHA)),))
    assert lock.models == (("Qwen/Qwen3.5-4B", replaced),)
    with pytest.raises(LockError, match=r'models\["Qwen/Qwen3.5-4B"\].revision'):
        with_model(lock, "Qwen/Qwen3.5-4B", "main", {})
    with pytest.raises(LockError, match=r'files\["../x"\]'):
        with_model(lock, "Qwen/Qwen3.5-4B", REV_A, {"../x": LockedFile(1, SHA)})
    lock = with_image(with_image(lock, "vllm:1", f"sha256:{SHA}"), "vllm:1", f"sha256:{'cd' * 32}")
    assert lock.images == (("vllm:1", f"sha256:{'cd' * 32}"),)
    with pytest.raises(LockError, match=r'images\["vllm:1"\]'):
        with_image(lock, "vllm:1", "latest")


def test_a_missing_lock_file_locks_nothing_and_an_unreadable_one_is_named(tmp_path):
    assert models.read_lock_file(str(tmp_path / "fleet.lock.yml")) == FleetLock()
    (tmp_path / "fleet.lock.yml").write_bytes(b"\xff\xfe")
    with pytest.raises(LockError, match=r"fleet\.lock\.yml: the file: cannot be read"):
        models.read_lock_file(str(tmp_path / "fleet.lock.yml"))


# ---------------------------------------------------------------- pins


def _mesh_with(**roles) -> dict:
    """The seed mesh with spark's role fields changed."""
    mesh = seed_mesh()
    for role, fields in roles.items():
        mesh["spark"]["fleet_roles"][role].update(fields)
    return mesh


def _lock(**revisions) -> FleetLock:
    lock = FleetLock()
    for checkpoint, revision in revisions.items():
        lock = with_model(lock, checkpoint.replace("__", "/"), revision, {})
    return lock


def test_every_hub_gear_is_pinned_declared_locked_or_unpinned():
    plan = plan_mesh(_mesh_with(embedder={"revision": REV_A}))
    lock = with_model(FleetLock(), "Qwen/Qwen3-Reranker-0.6B", REV_B, {})
    pins = {(pin.host, pin.role): pin for pin in model_pins(plan, lock)}
    assert pins["spark", "embedder"].source == "declared"
    assert pins["spark", "embedder"].revision == REV_A
    assert pins["spark", "reranker"].source == "locked"
    assert pins["spark", "reranker"].revision == REV_B
    assert pins["spark", "cortex"].source == "unpinned"
    assert pins["spark", "cortex"].revision is None
    # Only gears served on a box: orin's peer roles load nothing there.
    assert sorted(pins) == [("orin", "worker"), ("spark", "cortex"), ("spark", "embedder"),
                            ("spark", "reranker"), ("spark", "senses"), ("thor", "cortex")]
    assert plan["boxes"]["spark"]["roles"]["embedder"]["gear"]["revision"] == REV_A


def test_the_catalog_invents_no_revision():
    from ansible_collections.lobes.fleet.plugins.module_utils.contract import ROLES
    assert all(spec.revision is None for spec in ROLES)


def test_simulated_gears_and_local_checkpoints_are_never_pinned():
    mesh = seed_mesh()
    mesh["spark"]["fleet_gear_engine"] = "sim"
    mesh["orin"]["fleet_roles"]["worker"]["checkpoint"] = "lobes/tiny-chat"
    # A pool's members agree on the served id and quantization, wherever thor's files are.
    mesh["thor"]["fleet_roles"]["cortex"].update(
        checkpoint="/srv/models/cortex", served_name="sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP",
        quantization="modelopt_fp4")
    assert model_pins(plan_mesh(mesh), FleetLock()) == []


def test_unpinned_gears_warn_and_fail_where_pins_are_required():
    plan = plan_mesh(seed_mesh())
    pins = model_pins(plan, FleetLock())
    relaxed = pin_findings(pins)
    assert relaxed.errors == () and len(relaxed.warnings) == len(pins)
    assert "host spark, role cortex, field revision: sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP " \
           "has no pinned revision" in "\n".join(map(str, relaxed.warnings))
    strict = pin_findings(pins, require=True)
    assert strict.warnings == () and len(strict.errors) == len(pins)


def test_the_inventory_switch_makes_one_box_strict():
    mesh = seed_mesh()
    mesh["thor"]["fleet_models_require_pins"] = True
    findings = pin_findings(model_pins(plan_mesh(mesh), FleetLock()))
    assert [(error.host, error.role) for error in findings.errors] == [("thor", "cortex")]
    assert all(warning.host != "thor" for warning in findings.warnings)


def test_a_declared_revision_the_lock_contradicts_names_both_and_the_fix():
    plan = plan_mesh(_mesh_with(embedder={"revision": REV_A}))
    lock = with_model(FleetLock(), "Qwen/Qwen3-Embedding-0.6B", REV_B, {})
    findings = pin_findings(model_pins(plan, lock))
    assert len(findings.errors) == 1
    text = str(findings.errors[0])
    assert text.startswith("host spark, role embedder, field revision: ")
    assert REV_A in text and REV_B in text and "playbooks/models.yml" in text
    agreeing = with_model(FleetLock(), "Qwen/Qwen3-Embedding-0.6B", REV_A, {})
    assert pin_findings(model_pins(plan, agreeing)).errors == ()


def test_one_checkpoint_pinned_at_two_revisions_is_refused():
    mesh = seed_mesh()
    mesh["spark"]["fleet_roles"]["cortex"]["revision"] = REV_A
    mesh["thor"]["fleet_roles"]["cortex"]["revision"] = REV_B
    errors = pin_findings(model_pins(plan_mesh(mesh), FleetLock())).errors
    assert [(error.host, error.role) for error in errors] == [("thor", "cortex")]
    assert "host spark, role cortex pins it at " + REV_A in str(errors[0])


@pytest.mark.parametrize("value", ["main", REV_A.upper(), REV_A[:39], 40])
def test_the_schema_refuses_a_revision_naming_host_role_and_field(value):
    with pytest.raises(FleetErrors) as caught:
        plan_mesh(_mesh_with(embedder={"revision": value}))
    assert "host spark, role embedder, field revision: " in str(caught.value)
    assert "40 lowercase hex digits" in str(caught.value)


def test_the_schema_refuses_a_require_pins_that_is_not_a_boolean():
    mesh = seed_mesh()
    mesh["orin"]["fleet_models_require_pins"] = "maybe"
    with pytest.raises(FleetErrors, match="host orin, field fleet_models_require_pins: not true"):
        plan_mesh(mesh)


# ---------------------------------------------------------------- disk and fill rounds


def test_a_disk_short_of_room_is_named_with_both_sizes():
    needs = {("spark", "/var/lib/lobes/hf-cache"): 40 * GIB, ("thor", "/models"): 5 * GIB,
             ("orin", "/m"): 0}
    free = {("spark", "/var/lib/lobes/hf-cache"): 42 * GIB, ("thor", "/models"): 100 * GIB}
    assert disk_shortfalls(needs, free, 0) == []
    messages = disk_shortfalls(needs, free, 5 * GIB)
    assert messages == [
        f"host spark, path /var/lib/lobes/hf-cache: needs 45.00 GiB ({45 * GIB} bytes) with "
        f"5.00 GiB ({5 * GIB} bytes) headroom but 42.00 GiB ({42 * GIB} bytes) is free; free "
        f"3.00 GiB ({3 * GIB} bytes) there or point the models elsewhere"]
    assert disk_shortfalls({("x", "/p"): 1}, {}, 0)[0].startswith(
        "host x, path /p: needs 0.00 GiB (1 bytes)")
    assert disk_shortfalls({("x", "/p"): GIB}, {("x", "/p"): GIB}, 0) == []
    assert len(disk_shortfalls({("x", "/p"): GIB}, {("x", "/p"): GIB}, 1)) == 1


def test_one_holder_fills_three_boxes_in_two_rounds():
    assert fill_rounds(["a"], ["b", "c", "d"]) == [[("a", "b")], [("a", "c"), ("b", "d")]]
    assert fill_rounds(["a"], []) == []
    assert fill_rounds(["a", "b"], ["b"]) == []
    with pytest.raises(ValueError, match="no box holds"):
        fill_rounds([], ["a"])


_HOSTS = st.lists(st.text("abcdefghij", min_size=1, max_size=3), unique=True, max_size=40)


@settings(max_examples=300, deadline=None)
@given(_HOSTS.filter(bool), _HOSTS)
def test_fill_rounds_fill_every_box_once_from_a_holder_doubling_each_round(holders, needers):
    needers = [host for host in needers if host not in holders]
    rounds = fill_rounds(holders, needers)
    holding = set(holders)
    filled = []
    for pairs in rounds:
        sources = [source for source, _destination in pairs]
        assert len(sources) == len(set(sources))
        assert all(source in holding for source in sources)
        destinations = [destination for _source, destination in pairs]
        assert not holding & set(destinations)
        holding |= set(destinations)
        filled += destinations
    assert sorted(filled) == sorted(needers)
    assert len(rounds) == rounds_needed(len(holders), len(needers))
    if len(holders) == 1:
        assert len(rounds) == (len(needers)).bit_length()
    assert fill_rounds(holders, needers) == rounds


# ---------------------------------------------------------------- the module


def test_model_plan_returns_each_checkpoint_its_hosts_and_rounds(tmp_path):
    mesh = seed_mesh()
    mesh["thor"]["fleet_roles"]["embedder"] = {}
    mesh["orin"]["fleet_roles"]["embedder"] = {}
    plan = plan_mesh(mesh)
    lock_file = tmp_path / "fleet.lock.yml"
    lock_file.write_text(dump_lock(with_model(FleetLock(), "Qwen/Qwen3-Embedding-0.6B", REV_A,
                                              {"config.json": LockedFile(3, SHA)})))
    result = run_module(model_plan.main, {"plan": plan, "lock_file": str(lock_file)},
                        check_mode=True)
    assert not result.get("failed") and result["changed"] is False
    embedder = result["models"]["Qwen/Qwen3-Embedding-0.6B"]
    assert embedder["revision"] == REV_A and embedder["source"] == "locked"
    assert embedder["hosts"] == ["orin", "spark", "thor"]
    assert embedder["fetch_from_hub"] == "orin"
    assert embedder["rounds"] == [[["orin", "spark"]], [["orin", "thor"]]]
    cortex = result["models"]["sakamakismile/Qwen3.6-27B-Text-NVFP4-MTP"]
    assert cortex["revision"] is None and cortex["source"] == "unpinned"
    assert [warning.split(":")[0] for warning in cortex["warnings"]] == [
        "host spark, role cortex, field revision", "host thor, role cortex, field revision"]
    assert cortex["errors"] == []
    present = run_module(model_plan.main, {"plan": plan, "lock_file": str(lock_file),
                                           "present": {"Qwen/Qwen3-Embedding-0.6B": ["thor"]}})
    embedder = present["models"]["Qwen/Qwen3-Embedding-0.6B"]
    assert embedder["fetch_from_hub"] is None
    assert embedder["rounds"] == [[["thor", "orin"]], [["thor", "spark"]]]


def test_model_plan_fails_strict_naming_host_role_and_field(tmp_path):
    plan = plan_mesh(seed_mesh())
    result = run_module(model_plan.main, {"plan": plan, "lock_file": str(tmp_path / "none.yml"),
                                          "require_pins": True})
    assert result["failed"]
    assert "host orin, role worker, field revision: " in result["msg"]


def test_model_plan_names_a_broken_lock_file(tmp_path):
    lock_file = tmp_path / "fleet.lock.yml"
    lock_file.write_text("version: 1\nmodels:\n  Qwen/Qwen3.5-4B: {revision: x, files: {}}\n")
    result = run_module(model_plan.main, {"plan": plan_mesh(seed_mesh()),
                                          "lock_file": str(lock_file)})
    assert result["failed"]
    assert f'{lock_file}: models["Qwen/Qwen3.5-4B"].revision' in result["msg"]


PIN_A, PIN_B = "a" * 40, "b" * 40
TINY = {"config.json": {"size": 23, "sha256": "c" * 64}}


def test_model_lock_writes_the_entry_once_check_mode_writes_nothing_and_a_second_run_keeps_it(
        tmp_path):
    path = tmp_path / "fleet.lock.yml"
    args = {"lock_file": str(path), "checkpoint": "acme/tiny", "revision": PIN_A, "files": TINY}
    checked = run_module(model_lock.main, args, check_mode=True, diff=True)
    assert checked["changed"] is True and not path.exists()
    assert checked["diff"]["before"] == "" and f"revision: {PIN_A}" in checked["diff"]["after"]
    assert run_module(model_lock.main, args)["changed"] is True
    assert models.read_lock_file(str(path)).model("acme/tiny").revision == PIN_A
    text = path.read_text()
    again = run_module(model_lock.main, args, diff=True)
    assert again["changed"] is False and again["diff"]["before"] == again["diff"]["after"] == text
    assert path.read_text() == text


def test_model_lock_moves_a_pin_only_when_told(tmp_path):
    path = tmp_path / "fleet.lock.yml"
    args = {"lock_file": str(path), "checkpoint": "acme/tiny", "revision": PIN_A, "files": TINY}
    run_module(model_lock.main, args)
    text = path.read_text()
    refused = run_module(model_lock.main, {**args, "revision": PIN_B})
    assert refused["failed"] is True and f"is locked at {PIN_A}, not {PIN_B}" in refused["msg"]
    assert path.read_text() == text
    moved = run_module(model_lock.main, {**args, "revision": PIN_B, "replace": True})
    assert moved["changed"] is True
    assert models.read_lock_file(str(path)).model("acme/tiny").revision == PIN_B


def test_save_lock_makes_no_file_for_a_lock_with_nothing_new(tmp_path):
    path = str(tmp_path / "fleet.lock.yml")
    changed, diff = models.save_lock(path, FleetLock(), FleetLock(), check_mode=False)
    assert changed is False and diff["after"] == "" and not (tmp_path / "fleet.lock.yml").exists()
    new = with_image(FleetLock(), "r:t", "sha256:" + "d" * 64)
    changed, diff = models.save_lock(path, FleetLock(), new, check_mode=False)
    assert changed is True and (tmp_path / "fleet.lock.yml").read_text() == diff["after"]


def test_model_summary_of_no_pins_is_empty():
    assert model_summary([], {}) == {}
