"""lobes.fleet.source_tree through ansible: one run mirrors a tree, writing only what differs."""

from __future__ import annotations

from .conftest import ansible_module


def _deploy(src, dest, *, check: bool = False) -> dict:
    return ansible_module("lobes.fleet.source_tree", f"src={src} dest={dest}", check=check)


def test_mirrors_a_tree_and_rewrites_only_what_differs(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    (src / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "pkg" / "a.py").write_text("A = 1\n")
    (src / "pkg" / "b.py").write_text("B = 1\n")
    (src / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"bytecode")

    first = _deploy(src, dest)
    assert first["changed"] is True
    assert first["written"] == ["pkg/a.py", "pkg/b.py"]
    assert (dest / "pkg" / "a.py").read_text() == "A = 1\n"
    assert not (dest / "pkg" / "__pycache__").exists()
    assert _deploy(src, dest)["changed"] is False

    (src / "pkg" / "a.py").write_text("A = 2\n")
    (src / "pkg" / "b.py").unlink()
    (dest / "pkg" / "__pycache__").mkdir()
    (dest / "pkg" / "__pycache__" / "keep.pyc").write_bytes(b"box bytecode")
    second = _deploy(src, dest)
    assert second["written"] == ["pkg/a.py"]
    assert second["removed"] == ["pkg/b.py"]
    assert (dest / "pkg" / "a.py").read_text() == "A = 2\n"
    assert not (dest / "pkg" / "b.py").exists()
    assert (dest / "pkg" / "__pycache__" / "keep.pyc").exists()


def test_check_mode_reports_and_writes_nothing(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "app.py").write_text("print('hi')\n")

    planned = _deploy(src, dest, check=True)

    assert planned["changed"] is True
    assert planned["written"] == ["app.py"]
    assert "app.py" in planned["diff"]["after"]
    assert not dest.exists()


def test_a_missing_src_fails_naming_it(tmp_path):
    result = _deploy(tmp_path / "nowhere", tmp_path / "dest")

    assert result["failed"] is True
    assert "nowhere" in result["msg"]


def test_the_tree_it_replaces_is_kept_and_can_be_put_back(tmp_path):
    src, dest, kept = tmp_path / "src", tmp_path / "dest", tmp_path / "previous"
    src.mkdir()
    (src / "gateway.py").write_text("VERSION = 1\n")
    (src / "old.py").write_text("OLD = True\n")
    keep = f"backup_dir={kept}"
    ansible_module("lobes.fleet.source_tree", f"src={src} dest={dest} {keep}")
    (src / "gateway.py").write_text("VERSION = 2\n")
    (src / "old.py").unlink()
    (src / "new.py").write_text("NEW = True\n")

    upgrade = ansible_module("lobes.fleet.source_tree", f"src={src} dest={dest} {keep}")
    assert upgrade["changed"] is True
    assert (kept / "gateway.py").read_text() == "VERSION = 1\n"
    assert sorted(path.name for path in kept.iterdir()) == ["gateway.py", "old.py"]
    unchanged = ansible_module("lobes.fleet.source_tree", f"src={src} dest={dest} {keep}")
    assert unchanged["changed"] is False and (kept / "gateway.py").read_text() == "VERSION = 1\n"

    restore = ansible_module("lobes.fleet.source_tree", f"src={kept} dest={dest} remote_src=true")
    assert restore["written"] == ["gateway.py", "old.py"] and restore["removed"] == ["new.py"]
    assert sorted(path.name for path in dest.iterdir()) == ["gateway.py", "old.py"]
    assert (dest / "gateway.py").read_text() == "VERSION = 1\n"
