"""The one .env parser, services.json check and restart fingerprint that both runtimes use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.render import (
    format_env,
    gateway_health_url,
)
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import (
    EnvFileError,
    ServicesError,
    fingerprint,
    inputs_fingerprint,
    load_services,
    parse_env_file,
    parse_services,
    read_env_file,
    select,
)

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "golden"


def test_parse_env_file_subset() -> None:
    text = """
# a comment
PRIMARY_BASE_URL=http://127.0.0.1:8001
export GATEWAY_PORT = 8000
GATEWAY_API_KEY="quoted # not a comment"
GATEWAY_FLEET_KEY='single'  # a comment after the quote
EMPTY=
BLANK= # only a comment
TRAILING=value # comment
HASH=a#b
"""
    assert parse_env_file(text) == {
        "PRIMARY_BASE_URL": "http://127.0.0.1:8001", "GATEWAY_PORT": "8000",
        "GATEWAY_API_KEY": "quoted # not a comment", "GATEWAY_FLEET_KEY": "single",
        "EMPTY": "", "BLANK": "", "TRAILING": "value", "HASH": "a#b",
    }


@pytest.mark.parametrize(("text", "message"), [
    ("A=1\nnot a pair\n", r"line 2: 'not a pair' is not KEY=VALUE"),
    ("A=1\n\n1BAD=x\n", "line 3"),
    ('A="open\n', "line 1: the quote .* is never closed"),
    ("A='x' y\n", "line 1: 'y' follows the closing quote"),
], ids=["no equals", "bad name", "open quote", "text after quote"])
def test_parse_env_file_names_the_line_it_refuses(text: str, message: str) -> None:
    with pytest.raises(EnvFileError, match=message):
        parse_env_file(text)


def test_read_env_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "box.env"
    path.write_text("A=1\nB\n")
    with pytest.raises(EnvFileError, match=f"{path}, line 2"):
        read_env_file(str(path))


def test_every_rendered_env_reads_back_as_rendered() -> None:
    env = [("PLAIN", "http://a:1"), ("SPACED", "two words # kept"), ("EMPTY", "")]
    assert parse_env_file(format_env(env)) == dict(env)
    for path in sorted(GOLDEN.glob("*/*/.env")):
        assert parse_env_file(path.read_text()), path


def _document(**service: object) -> dict:
    return {"host": "box", "services": [{"name": "gateway", "argv": ["python3"], **service}]}


def test_parse_services_types_and_resolves_paths() -> None:
    services = parse_services(_document(env_file=".env", cwd="run", watch=["gateway/x"]),
                              "/srv/lobes")
    assert services.host == "box"
    (service,) = services.services
    assert service.argv == ("python3",)
    assert service.workdir == "/srv/lobes/run"
    assert service.env_path == "/srv/lobes/.env"
    assert service.watch == ("gateway/x",)
    assert (service.pidfile_name, service.log_name) == ("gateway.pid", "gateway.log")


@pytest.mark.parametrize(("document", "message"), [
    ({"services": {}}, "'services' list"),
    ({"services": [{"argv": ["x"]}]}, r"services\[0\]: field 'name' must be a str"),
    (_document(name="a b"), "service 'a b': field 'name' may hold only"),
    (_document(argv=[]), "service 'gateway': field 'argv' must be a non-empty list"),
    (_document(argv=["x", 1]), "service 'gateway': field 'argv' must be a list of strings"),
    (_document(env={"A": 1}), "service 'gateway': field 'env' must map names to strings"),
    (_document(env={"A B": "1"}), "service 'gateway': field 'env' must map names"),
    (_document(env_file=1), "service 'gateway': field 'env_file' must be a str"),
    (_document(cwd=["."]), "service 'gateway': field 'cwd' must be a str"),
    (_document(watch="gateway"), "service 'gateway': field 'watch' must be a list"),
    (_document(log="../x.log"), "service 'gateway': field 'log' must be a bare file name"),
    ({"host": 1, "services": []}, "field 'host' must be a str"),
    ({"services": [{"name": "a", "argv": ["x"]}, {"name": "a", "argv": ["y"]}]},
     r"duplicate service names \['a'\]"),
])
def test_a_bad_services_document_is_refused_naming_service_and_field(document: dict,
                                                                     message: str) -> None:
    with pytest.raises(ServicesError, match=message):
        parse_services(document, "/srv/lobes")


def test_load_services_reads_relative_to_its_directory(tmp_path: Path) -> None:
    path = tmp_path / "services.json"
    path.write_text(json.dumps(_document()))
    assert load_services(str(path)).services[0].workdir == str(tmp_path)
    path.write_text("{")
    with pytest.raises(ServicesError, match="cannot read services file"):
        load_services(str(path))


def test_select_names_and_excludes() -> None:
    services = parse_services({"services": [{"name": n, "argv": ["x"]} for n in "abc"]},
                              "/srv").services
    assert [s.name for s in select(services, ["a", "b"], ["b"])] == ["a"]
    assert [s.name for s in select(services, exclude=["a"])] == ["b", "c"]
    with pytest.raises(ServicesError, match=r"\['z'\].*\['a', 'b', 'c'\]"):
        select(services, ["z"])


def test_the_inputs_fingerprint_follows_content_but_not_pycache(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "__pycache__").mkdir(parents=True)
    (code / "app.py").write_text("VERSION = 1\n")
    (tmp_path / ".env").write_text("A=1\n")
    (service,) = parse_services(_document(env_file=".env", watch=["code"]),
                                str(tmp_path)).services
    first = inputs_fingerprint(service)
    (code / "__pycache__" / "app.pyc").write_bytes(b"compiled")
    (code / "dangling").symlink_to(tmp_path / "nowhere")
    assert inputs_fingerprint(service) == first
    (code / "app.py").write_text("VERSION = 2\n")
    second = inputs_fingerprint(service)
    assert second != first
    (tmp_path / ".env").write_text("A=2\n")
    assert inputs_fingerprint(service) != second
    assert inputs_fingerprint(service, [str(tmp_path / "extra")]) != inputs_fingerprint(service)


def test_the_restart_fingerprint_covers_the_definition_and_the_inputs(tmp_path: Path) -> None:
    def of(**service: object) -> str:
        return fingerprint(parse_services(_document(**service), str(tmp_path)).services[0])

    base = of()
    assert base == of(log="other.log")
    assert len({base, of(argv=["python3", "-V"]), of(cwd="sub"), of(env={"A": "1"}),
                of(env_file=".env")}) == 5
    (tmp_path / "code").mkdir()
    watched = of(watch=["code"])
    (tmp_path / "code" / "app.py").write_text("x")
    assert of(watch=["code"]) != watched


@pytest.mark.parametrize(("host", "url"), [
    ("0.0.0.0", "http://127.0.0.1:8000/health"),
    ("::", "http://[::1]:8000/health"),
    ("100.64.0.11", "http://100.64.0.11:8000/health"),
    ("fd7a:115c:a1e0::11", "http://[fd7a:115c:a1e0::11]:8000/health"),
])
def test_the_gateway_is_waited_for_where_it_listens(host: str, url: str) -> None:
    assert gateway_health_url({"gateway": {"host": host, "port": 8000}}) == url
    # The URL is one the supervisor accepts (an http:// health URL).
    parse_services(_document(health=url), "/srv/lobes")
