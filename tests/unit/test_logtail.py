"""What a start failure quotes of a service's log (the supervisor's and compose's): the last
lines, every secret masked."""

from __future__ import annotations

from ansible_collections.lobes.fleet.plugins.module_utils.contract import is_secret_env
from ansible_collections.lobes.fleet.plugins.module_utils.service_files import (
    LOG_TAIL_LINES,
    MASK,
    Service,
    env_file_secrets,
    masked_tail,
    secret_values,
    service_secrets,
)


def test_secret_values_are_the_contracts_secret_variables_and_each_key_of_a_list():
    env = {
        "GATEWAY_API_KEY": "sk-box",
        "PRIMARY_PEER_API_KEYS": "sk-one,,sk-two",
        "GATEWAY_CLIENT_KEYS": "ci=sk-ci:batch,ops=sk-ops:interactive:4",
        "PRIMARY_BASE_URL": "http://127.0.0.1:8001",
        "GATEWAY_PORT": "8000",
    }

    assert secret_values(env, is_secret_env) == {
        "sk-box", "sk-one,,sk-two", "sk-one", "sk-two",
        "ci=sk-ci:batch,ops=sk-ops:interactive:4", "sk-ci", "sk-ops"}


def test_service_secrets_read_the_env_file_and_the_services_own_env(tmp_path):
    (tmp_path / "box.env").write_text("GATEWAY_FLEET_KEY=sk-fleet\nGATEWAY_HOST=0.0.0.0\n")
    spec = Service(name="gateway", argv=("python3",), base_dir=str(tmp_path),
                   env_file="box.env", env={"CULTURE_VLLM_API_KEY": "sk-legacy"})

    assert service_secrets(spec, is_secret_env) == {"sk-fleet", "sk-legacy"}


def test_an_env_file_missing_or_not_parsing_has_no_secrets(tmp_path):
    (tmp_path / "bad.env").write_text("not a line of a .env\n")

    assert env_file_secrets(str(tmp_path / "absent.env"), is_secret_env) == set()
    assert env_file_secrets(str(tmp_path / "bad.env"), is_secret_env) == set()


def test_the_tail_is_the_last_lines_with_every_secret_masked_longest_first(tmp_path):
    log = tmp_path / "gateway.log"
    log.write_text("".join(f"line {n}\n" for n in range(40))
                   + "keys sk-one,sk-two and sk-one alone\n")

    tail = masked_tail(str(log), {"sk-one,sk-two", "sk-one", "sk-two"})

    lines = tail.splitlines()
    assert len(lines) == LOG_TAIL_LINES
    assert lines[-1] == f"keys {MASK} and {MASK} alone"
    assert lines[0] == f"line {41 - LOG_TAIL_LINES}"


def test_a_large_log_is_read_from_its_end_and_its_cut_first_line_left_out(tmp_path):
    log = tmp_path / "gear.log"
    # One long line holding a key near its start, then a few short ones: the read starts
    # inside the long line, past the key, so that line must not be quoted at all.
    log.write_text("key sk-secret " + "x" * 40_000 + "\nlast words\n")

    tail = masked_tail(str(log), {"sk-secret"})

    assert tail == "last words"


def test_a_missing_or_empty_log_has_no_tail(tmp_path):
    (tmp_path / "empty.log").write_text("")

    assert masked_tail(str(tmp_path / "absent.log"), set()) == ""
    assert masked_tail(str(tmp_path / "empty.log"), set()) == ""
