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
