"""A value or key that ends in a newline is never written bare: `$` in a pattern matches
before a final newline, so the render's plain-text checks anchor at the very end."""

from __future__ import annotations

import pytest
from ansible_collections.lobes.fleet.plugins.module_utils.render import (
    RenderError,
    env_line,
    to_yaml,
)
from hypothesis import given
from hypothesis import strategies as st

PLAIN = st.text(alphabet="abcXYZ019_./:@,=+-", max_size=20)


@given(PLAIN)
def test_a_plain_value_is_written_bare_and_one_ending_in_a_newline_is_refused(value):
    assert env_line("NAME", value) == f"NAME={value}"
    with pytest.raises(RenderError):
        env_line("NAME", value + "\n")


def test_a_compose_key_ending_in_a_newline_is_refused():
    assert to_yaml({"gateway": 1}) == "gateway: 1\n"
    with pytest.raises(RenderError):
        to_yaml({"gateway\n": 1})
