"""mesh_plan as operators run it: through ansible-playbook, with --limit and a broken mesh."""

from __future__ import annotations

import shutil

import yaml
from ansible_collections.lobes.fleet.plugins.module_utils.hardware import VLLM_JETSON

from tests.unit import rendering
from tests.unit.rendering import GOLDEN, run_render


def test_limit_still_plans_the_whole_mesh(tmp_path):
    result = run_render("tailnet", tmp_path, "--limit", "agx-orin")
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["agx-orin"]
    rendered = (tmp_path / "agx-orin" / ".env").read_text()
    assert rendered == (GOLDEN / "tailnet" / "agx-orin" / ".env").read_text()


def test_a_broken_mesh_fails_the_play_naming_host_role_and_field(tmp_path):
    source = rendering.INVENTORIES["sim-mesh"][0]
    broken = tmp_path / "inventory"
    shutil.copytree(source, broken)
    beta = broken / "host_vars" / "beta.yml"
    variables = yaml.safe_load(beta.read_text())
    variables["fleet_roles"]["senses"]["proxy"] = "beta"
    beta.write_text(yaml.safe_dump(variables))
    rendering.INVENTORIES["broken"] = (broken, None)
    try:
        result = run_render("broken", tmp_path / "out")
    finally:
        del rendering.INVENTORIES["broken"]
    assert result.returncode != 0
    assert "host beta, role senses, field proxy: names this box itself" in result.stdout
    assert not (tmp_path / "out").exists()


def _tailnet_copy(tmp_path, lock_text: str | None, **spark_roles) -> str:
    """The tailnet inventory copied with spark's role fields changed and a lock file beside
    it; registered under a name of its own for run_render."""
    source, vault = rendering.INVENTORIES["tailnet"]
    copy = tmp_path / "inventory"
    shutil.copytree(source, copy)
    spark = copy / "host_vars" / "spark.yml"
    text = spark.read_text()
    for role, fields in spark_roles.items():
        text = text.replace(f"  {role}: {{}}\n", f"  {role}: {fields}\n")
    spark.write_text(text)
    if lock_text is not None:
        (copy / "fleet.lock.yml").write_text(lock_text)
    rendering.INVENTORIES["pinned"] = (copy, vault)
    return "pinned"


def test_a_declared_revision_the_lock_contradicts_stops_the_play_before_render(tmp_path):
    declared, locked = "0" * 39 + "1", "f" * 40
    lock = (f"version: 1\nmodels:\n  Qwen/Qwen3-Embedding-0.6B:\n    revision: {locked}\n"
            "    files: {}\n")
    name = _tailnet_copy(tmp_path, lock, embedder=f"{{revision: '{declared}'}}")
    try:
        result = run_render(name, tmp_path / "out")
    finally:
        del rendering.INVENTORIES[name]
    assert result.returncode != 0
    assert "host spark, role embedder, field revision: declares Qwen/Qwen3-Embedding-0.6B at " \
           f"{declared} but fleet.lock.yml locks {locked}" in result.stdout
    assert not (tmp_path / "out").exists()


def test_an_unpinned_gear_is_a_warning_and_a_broken_lock_file_stops_the_play(tmp_path):
    name = _tailnet_copy(tmp_path, "version: 1\nmodels: {Qwen/Qwen3-Embedding-0.6B: {}}\n")
    try:
        result = run_render(name, tmp_path / "out")
    finally:
        del rendering.INVENTORIES[name]
    assert result.returncode != 0
    assert 'fleet.lock.yml: models["Qwen/Qwen3-Embedding-0.6B"].revision: is missing' \
        in result.stdout
    name = _tailnet_copy(tmp_path / "again", None)
    try:
        result = run_render(name, tmp_path / "out")
    finally:
        del rendering.INVENTORIES[name]
    assert result.returncode == 0, result.stdout + result.stderr
    assert "host spark, role embedder, field revision: Qwen/Qwen3-Embedding-0.6B has no " \
           "pinned revision" in result.stdout + result.stderr


JETSON_DIGEST = "sha256:" + "3c" * 32


def test_a_locked_image_renders_by_digest_on_every_box_of_its_groups_and_the_rest_stays(tmp_path):
    lock = f"version: 1\nimages:\n  {VLLM_JETSON}: {JETSON_DIGEST}\n"
    name = _tailnet_copy(tmp_path, lock)
    try:
        result = run_render(name, tmp_path / "out")
    finally:
        del rendering.INVENTORIES[name]
    assert result.returncode == 0, result.stdout + result.stderr
    for host, gear in (("agx-orin", "vllm-worker"), ("agx-thor", "vllm-cortex")):
        compose = yaml.safe_load((tmp_path / "out" / host / "compose.yaml").read_text())
        golden = yaml.safe_load((GOLDEN / "tailnet" / host / "compose.yaml").read_text())
        assert golden["services"][gear]["image"] == VLLM_JETSON
        assert compose["services"][gear]["image"] == f"nvcr.io/nvidia/vllm@{JETSON_DIGEST}"
        # Only the locked image changed: the rest is the golden file's.
        golden["services"][gear]["image"] = f"nvcr.io/nvidia/vllm@{JETSON_DIGEST}"
        assert compose == golden
    spark = (tmp_path / "out" / "spark" / "compose.yaml").read_text()
    assert spark == (GOLDEN / "tailnet" / "spark" / "compose.yaml").read_text()


def test_a_lock_whose_images_contradict_themselves_stops_the_play_before_render(tmp_path):
    lock = f"version: 1\nimages:\n  \"nvcr.io/nvidia/vllm@{JETSON_DIGEST}\": sha256:{'4d' * 32}\n"
    name = _tailnet_copy(tmp_path, lock)
    try:
        result = run_render(name, tmp_path / "out")
    finally:
        del rendering.INVENTORIES[name]
    assert result.returncode != 0
    assert f"names {JETSON_DIGEST} but is locked to sha256:{'4d' * 32}" in result.stdout
    assert not (tmp_path / "out").exists()
