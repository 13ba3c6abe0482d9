"""Engine images through the lock file: which reference each gear container runs, the lock's
images section read against itself, one image per hardware group, and the digests the boxes
report turned into lock entries (module_utils/images.py, the image_lock module)."""

from __future__ import annotations

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils import images, models
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import (
    VLLM_JETSON,
    VLLM_NIGHTLY,
)
from ansible_collections.lobes.fleet.plugins.module_utils.plan import plan_mesh
from ansible_collections.lobes.fleet.plugins.modules import image_digest, image_lock
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.mesh import seed_mesh
from tests.unit.modules import run_module

D1 = "sha256:" + "1a" * 32
D2 = "sha256:" + "2b" * 32
LOCAL = "127.0.0.1:5000/lobes/sim:v1"


def locked(*pairs: tuple) -> models.FleetLock:
    lock = models.FleetLock()
    for ref, digest in pairs:
        lock = models.with_image(lock, ref, digest)
    return lock


# ---------------------------------------------------------------- references


@pytest.mark.parametrize(("ref", "name", "tag", "digest"), [
    (VLLM_NIGHTLY, "vllm/vllm-openai", None, VLLM_NIGHTLY.split("@")[1]),
    (VLLM_JETSON, "nvcr.io/nvidia/vllm", "26.04-py3", None),
    (LOCAL, "127.0.0.1:5000/lobes/sim", "v1", None),
    ("python", "python", None, None),
    (f"localhost:5000/a/b:t@{D1}", "localhost:5000/a/b", "t", D1),
])
def test_a_reference_splits_into_name_tag_and_digest(ref, name, tag, digest):
    assert images.parse_ref(ref) == images.ImageRef(name, tag, digest)


@pytest.mark.parametrize("ref", [
    "", "repo/UPPER:tag", "repo:", "repo@sha256:abc", "repo@md5:" + "0" * 32, "a b:tag",
    "repo:-tag", "/repo", "repo//x", "x" * 401, f"repo@{D1.upper()}",
])
def test_a_text_that_is_no_reference_is_refused(ref):
    with pytest.raises(images.ImageRefError):
        images.parse_ref(ref)


@settings(max_examples=300)
@given(st.text(max_size=120))
def test_any_text_is_refused_or_reassembles_to_itself(text):
    try:
        parts = images.parse_ref(text)
    except images.ImageRefError:
        return
    rebuilt = parts.name + (f":{parts.tag}" if parts.tag else "") + \
        (f"@{parts.digest}" if parts.digest else "")
    assert rebuilt == text


def test_two_spellings_of_one_docker_hub_repository_are_one_name():
    assert images.canonical_name("python") == images.canonical_name("docker.io/library/python")
    assert images.canonical_name("vllm/vllm-openai") == "docker.io/vllm/vllm-openai"
    assert images.canonical_name("localhost/x") == "localhost/x"
    assert images.canonical_name("127.0.0.1:5000/x") == "127.0.0.1:5000/x"
    assert images.canonical_name("Registry/x") == "Registry/x"


# ---------------------------------------------------------------- what runs


def test_a_digest_named_image_runs_as_named_whatever_the_lock():
    assert images.image_to_run(VLLM_NIGHTLY, models.FleetLock()) == (VLLM_NIGHTLY, images.NAMED)


def test_a_tag_named_image_runs_its_locked_digest_and_without_one_is_resolved_on_deploy():
    assert images.image_to_run(VLLM_JETSON, locked((VLLM_JETSON, D1))) == (
        f"nvcr.io/nvidia/vllm@{D1}", images.LOCKED)
    assert images.image_to_run(VLLM_JETSON, locked(("nvcr.io/nvidia/vllm:other", D1))) == (
        VLLM_JETSON, images.RESOLVE)


def compose_mesh() -> dict:
    """The seeds' mesh under compose, with a second Thor: two boxes of one hardware group."""
    mesh = seed_mesh()
    mesh["thor2"] = {**mesh["thor"], "ansible_host": "thor2.tail0be7e0.ts.net",
                     "fleet_roles": {"cortex": {"context": 262144, "yarn_factor": 2.0,
                                                "mtp": False, "gpu_memory_utilization": 0.60}}}
    return mesh


def test_the_plan_runs_the_locked_digest_on_every_box_of_the_group_and_leaves_named_ones():
    plan = plan_mesh(compose_mesh())
    lock = locked((VLLM_JETSON, D1))
    found, errors = images.gear_images(plan, lock)
    assert errors == []
    by_box = {(image.host, image.role): (image.run, image.state) for image in found}
    jetson = (f"nvcr.io/nvidia/vllm@{D1}", images.LOCKED)
    assert by_box[("thor", "cortex")] == by_box[("thor2", "cortex")] == jetson
    assert by_box[("orin", "worker")] == jetson
    assert by_box[("spark", "cortex")] == (VLLM_NIGHTLY, images.NAMED)
    assert images.group_splits(found) == []
    images.with_images_to_run(plan, found)
    assert plan["boxes"]["thor2"]["gears"]["image"] == f"nvcr.io/nvidia/vllm@{D1}"
    gear = plan["boxes"]["thor"]["roles"]["cortex"]["gear"]
    assert (gear["image"], gear["image_state"]) == jetson
    assert images.expected_digest(gear) == D1


def test_an_unlocked_tag_image_runs_by_tag_until_the_deploy_resolves_it():
    found, _errors = images.gear_images(plan_mesh(compose_mesh()), models.FleetLock())
    by_box = {(image.host, image.role): (image.run, image.state) for image in found}
    assert by_box[("thor", "cortex")] == (VLLM_JETSON, images.RESOLVE)
    assert by_box[("spark", "cortex")] == (VLLM_NIGHTLY, images.NAMED)


def test_a_box_whose_images_come_from_boxes_runs_the_copy_tag_of_the_locked_digest():
    mesh = compose_mesh()
    mesh["thor2"]["fleet_images_from"] = "boxes"
    plan = plan_mesh(mesh)
    found, errors = images.gear_images(plan, locked((VLLM_JETSON, D1)))
    assert errors == []
    pinned = f"nvcr.io/nvidia/vllm@{D1}"
    by_box = {image.host: image for image in found if image.role == "cortex"}
    assert (by_box["thor2"].run, by_box["thor2"].copy) == (pinned, pinned)
    assert by_box["thor"].copy == ""  # a box that reaches the registry pulls as before
    assert images.group_splits(found) == []  # one digest for the group, however it arrives
    images.with_images_to_run(plan, found)
    tag = f"nvcr.io/nvidia/vllm:lobes-sha256-{D1.split(':')[1]}"
    assert plan["boxes"]["thor2"]["gears"]["image"] == tag
    gear = plan["boxes"]["thor2"]["roles"]["cortex"]["gear"]
    assert (gear["image"], gear["image_copy"]) == (tag, pinned)
    assert images.expected_digest(gear) == D1
    assert images.parse_ref(tag).tag == tag.split(":")[1]  # a tag Docker accepts


def test_an_unlocked_tag_on_a_box_that_copies_its_images_is_refused_naming_the_fix():
    mesh = compose_mesh()
    mesh["thor2"]["fleet_images_from"] = "boxes"
    _found, errors = images.gear_images(plan_mesh(mesh), models.FleetLock())
    assert [(error.host, error.role, error.field) for error in errors] == [
        ("thor2", "cortex", "fleet_gear_image")]
    assert VLLM_JETSON in str(errors[0]) and "name the image by digest" in str(errors[0])
    assert "fleet.lock.yml images section" in str(errors[0])


def test_a_copied_image_runs_its_digest_when_its_container_runs_the_copy_tags_image():
    pinned = f"127.0.0.1:5000/lobes/sim@{D1}"
    tag = images.copy_tag(pinned)
    gear = {"service": "vllm-cortex", "image": tag, "image_copy": pinned}
    runs = {"vllm-cortex": {"image_id": "sha256:" + "9" * 64, "repo_digests": [],
                            "repo_tags": [tag]}}
    assert images.running_digest(gear, runs) == D1
    runs["vllm-cortex"]["repo_tags"] = [images.copy_tag(f"127.0.0.1:5000/lobes/sim@{D2}")]
    assert images.running_digest(gear, runs) == f"image sha256:{'9' * 64} without a digest " \
        "of 127.0.0.1:5000/lobes/sim"
    with pytest.raises(images.ImageRefError):
        images.copy_tag(LOCAL)


def test_image_digest_refuses_a_text_that_is_no_reference_before_it_runs_docker():
    result = run_module(image_digest.main, {"refs": ["Not An Image"], "pull": True})
    assert result["failed"] is True and "refs: 'Not An Image'" in result["msg"]


def test_a_group_whose_boxes_declare_two_images_is_refused_naming_both_hosts():
    mesh = compose_mesh()
    mesh["thor2"]["fleet_gear_image"] = "nvcr.io/nvidia/vllm:26.05-py3"
    found, _errors = images.gear_images(plan_mesh(mesh), locked((VLLM_JETSON, D1)))
    errors = [str(error) for error in images.group_splits(found)]
    assert errors == [
        "host thor2, role cortex, field fleet_gear_image: runs nvcr.io/nvidia/vllm:26.05-py3 but "
        f"host thor of the same hardware group thor runs nvcr.io/nvidia/vllm@{D1}; every box of "
        "a group runs the same image: declare one fleet_gear_image for the group"]


@pytest.mark.parametrize("how", ["null", "absent"])
def test_boxes_whose_plans_name_no_hardware_share_no_group(how):
    mesh = compose_mesh()
    mesh["thor2"]["fleet_gear_image"] = "nvcr.io/nvidia/vllm:26.05-py3"
    plan = plan_mesh(mesh)
    for host in ("thor", "thor2"):
        if how == "null":
            plan["boxes"][host]["hardware"] = None
        else:
            del plan["boxes"][host]["hardware"]
    found, errors = images.gear_images(plan, locked((VLLM_JETSON, D1)))
    assert errors == []
    groups = {image.host: image.group for image in found}
    assert groups["thor"] == groups["thor2"] == "" and groups["spark"] == "gb10"
    # Two images, but no profile puts the two boxes in one group: nothing to split.
    assert images.group_splits(found) == []


def test_a_planned_image_that_is_no_reference_is_refused_naming_host_and_field():
    plan = plan_mesh(compose_mesh())
    plan["boxes"]["thor2"]["gears"]["image"] = "Not An Image"  # the schema refuses it earlier
    _found, errors = images.gear_images(plan, models.FleetLock())
    assert [(error.host, error.role, error.field) for error in errors] == [
        ("thor2", "cortex", "fleet_gear_image")]


def test_the_process_runtime_runs_no_image():
    mesh = seed_mesh()
    mesh["spark"].update(fleet_runtime="process", fleet_hardware="sim")
    found, _errors = images.gear_images(plan_mesh(mesh), models.FleetLock())
    assert "spark" not in {image.host for image in found}


# ---------------------------------------------------------------- the lock's images section


def test_a_consistent_images_section_has_no_contradiction():
    lock = locked((VLLM_JETSON, D1), ("python:3.12", D2), ("docker.io/library/python:3.12", D2))
    assert images.lock_contradictions(lock) == []


def test_a_digest_named_entry_locked_to_another_digest_contradicts_itself():
    lock = locked((f"nvcr.io/nvidia/vllm@{D1}", D2))
    [problem] = images.lock_contradictions(lock)
    assert f"names {D1} but is locked to {D2}" in problem


def test_one_image_spelt_twice_with_two_digests_contradicts_itself():
    lock = locked(("python:3.12", D1), ("docker.io/library/python:3.12", D2))
    [problem] = images.lock_contradictions(lock)
    assert "the same image" in problem and D1 in problem and D2 in problem


def test_an_images_section_round_trips_through_the_lock_file():
    lock = locked((VLLM_JETSON, D1), (LOCAL, D2))
    text = models.dump_lock(lock)
    assert models.parse_lock(text, "fleet.lock.yml") == lock
    assert f"  {VLLM_JETSON}: {D1}\n" in text


@settings(max_examples=200)
@given(st.dictionaries(st.text(min_size=1, max_size=60), st.sampled_from([D1, D2]),
                       max_size=4))
def test_any_written_images_section_reads_back_or_is_refused_on_write(entries):
    lock = models.FleetLock()
    try:
        for ref, digest in entries.items():
            lock = models.with_image(lock, ref, digest)
    except models.LockError:
        return
    assert models.parse_lock(models.dump_lock(lock), "fleet.lock.yml") == lock
    assert all(isinstance(problem, str) for problem in images.lock_contradictions(lock))


# ---------------------------------------------------------------- what the boxes report


def resolving(*hosts: str, ref: str = VLLM_JETSON, group: str = "thor") -> list:
    return [images.GearImage(host, group, "cortex", "vllm-cortex", "image", ref, ref,
                             images.RESOLVE) for host in hosts]


def test_boxes_reporting_one_digest_lock_it():
    result = images.resolve_from_boxes(resolving("thor", "thor2"),
                                       {"thor": {VLLM_JETSON: D1}, "thor2": {VLLM_JETSON: D1}})
    assert result == images.Resolution(entries=((VLLM_JETSON, D1),))


def test_boxes_reporting_two_digests_lock_nothing_and_name_hosts_and_digests():
    result = images.resolve_from_boxes(resolving("thor", "thor2"),
                                       {"thor": {VLLM_JETSON: D1}, "thor2": {VLLM_JETSON: D2}})
    assert result.entries == ()
    [error] = result.errors
    assert f"host thor: {D1}; host thor2: {D2}" in error


def test_a_box_without_a_registry_digest_beside_one_with_is_a_split():
    result = images.resolve_from_boxes(resolving("thor", "thor2"),
                                       {"thor": {VLLM_JETSON: D1}, "thor2": {VLLM_JETSON: None}})
    assert result.entries == () and "host thor2: no registry digest" in result.errors[0]


def test_an_image_no_box_holds_a_registry_digest_for_stays_unlocked_with_a_note():
    result = images.resolve_from_boxes(resolving("a", "b", ref=LOCAL),
                                       {"a": {LOCAL: None}, "b": {LOCAL: None}})
    assert result.entries == () and result.errors == () and LOCAL in result.notes[0]


def test_a_box_that_did_not_report_is_an_error():
    result = images.resolve_from_boxes(resolving("thor", "thor2"), {"thor": {VLLM_JETSON: D1}})
    assert result.entries == () and "not read on host thor2" in result.errors[0]


@given(st.dictionaries(st.sampled_from(["thor", "thor2", "x"]),
                       st.one_of(st.none(), st.text(max_size=5),
                                 st.dictionaries(st.sampled_from([VLLM_JETSON, "y"]),
                                                 st.one_of(st.none(), st.text(max_size=70),
                                                           st.sampled_from([D1, D2, 3]))))))
def test_any_report_locks_only_real_digests_that_every_box_agrees_on(found):
    result = images.resolve_from_boxes(resolving("thor", "thor2"), found)
    for ref, digest in result.entries:
        assert ref == VLLM_JETSON and found["thor"][ref] == found["thor2"][ref] == digest
        assert models.DIGEST.fullmatch(digest)
    assert len(result.entries) + len(result.errors) + len(result.notes) == 1


def test_the_digests_held_are_those_of_the_repository_asked_for():
    repo_digests = [f"python@{D1}", f"docker.io/library/python@{D2}", f"other@{D1}",
                    "python@sha256:short", 7]
    assert images.held_digests("docker.io/library/python", repo_digests) == [D1, D2]
    assert images.held_digests("python", None) == []


def test_what_a_gear_container_runs_is_its_images_digest_of_the_pinned_repository():
    gear = {"service": "vllm-cortex", "image": f"127.0.0.1:5000/lobes/sim@{D1}"}
    runs = {"vllm-cortex": {"image_id": "sha256:" + "9" * 64,
                            "repo_digests": [f"127.0.0.1:5000/lobes/sim@{D2}"]}}
    assert images.running_digest(gear, runs) == D2
    runs["vllm-cortex"]["repo_digests"].append(f"127.0.0.1:5000/lobes/sim@{D1}")
    assert images.running_digest(gear, runs) == D1
    runs["vllm-cortex"]["repo_digests"] = []
    assert images.running_digest(gear, runs) == f"image sha256:{'9' * 64} without a digest " \
        "of 127.0.0.1:5000/lobes/sim"
    assert images.running_digest(gear, {}) == "no container"


# ---------------------------------------------------------------- image_lock


def as_args(found: list) -> list:
    return [{**vars(image)} for image in found]


def test_image_lock_writes_the_agreed_digest_once_and_a_second_run_changes_nothing(tmp_path):
    path = tmp_path / "fleet.lock.yml"
    args = {"lock_file": str(path), "images": as_args(resolving("thor", "thor2")),
            "found": {"thor": {VLLM_JETSON: D1}, "thor2": {VLLM_JETSON: D1}}}
    checked = run_module(image_lock.main, args, check_mode=True, diff=True)
    assert checked["changed"] is True and not path.exists()
    assert f"{VLLM_JETSON}: {D1}" in checked["diff"]["after"]
    first = run_module(image_lock.main, args)
    assert first["changed"] is True and first["locked"] == {VLLM_JETSON: D1}
    assert models.read_lock_file(str(path)).image(VLLM_JETSON) == D1
    text = path.read_text()
    assert run_module(image_lock.main, args)["changed"] is False
    assert path.read_text() == text


def test_image_lock_keeps_the_models_and_never_replaces_a_locked_digest(tmp_path):
    path = tmp_path / "fleet.lock.yml"
    lock = models.with_model(models.FleetLock(), "Qwen/Qwen3.5-4B", "0" * 40, {})
    path.write_text(models.dump_lock(models.with_image(lock, VLLM_JETSON, D1)))
    before = path.read_text()
    result = run_module(image_lock.main, {
        "lock_file": str(path), "images": as_args(resolving("thor")),
        "found": {"thor": {VLLM_JETSON: D2}}})
    assert result["changed"] is False and path.read_text() == before


def test_image_lock_refuses_a_split_group_and_writes_nothing(tmp_path):
    path = tmp_path / "fleet.lock.yml"
    result = run_module(image_lock.main, {
        "lock_file": str(path), "images": as_args(resolving("thor", "thor2")),
        "found": {"thor": {VLLM_JETSON: D1}, "thor2": {VLLM_JETSON: D2}}})
    assert result["failed"] is True and not path.exists()
    assert f"host thor: {D1}; host thor2: {D2}" in result["msg"]


def test_image_lock_creates_no_file_when_there_is_nothing_to_lock(tmp_path):
    path = tmp_path / "fleet.lock.yml"
    result = run_module(image_lock.main, {
        "lock_file": str(path), "images": as_args(resolving("a", ref=LOCAL)),
        "found": {"a": {LOCAL: None}}})
    assert result["changed"] is False and not path.exists()
    assert LOCAL in str(result["warnings"])
