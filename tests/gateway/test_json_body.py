"""A request's JSON body (transport/json_body.py), in process: read once and strictly, and
changed member by member, the caller's bytes kept everywhere else. Generated bodies
(hypothesis) hold the rules over shapes nobody wrote down."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lobes_gateway.transport.json_body import MAX_ELEMENTS, BodyError, parse_body


def refused(raw: bytes) -> BodyError:
    with pytest.raises(BodyError) as caught:
        parse_body(raw)
    return caught.value


@pytest.mark.parametrize(("raw", "says"), [
    (b'{"model": NaN}', "NaN"),
    (b'{"x": Infinity}', "Infinity"),
    (b'{"x": -Infinity}', "Infinity"),
    (b'{"x": 1e400}', "out of range"),
    (b'{"x": -1e400}', "out of range"),
    (b'{"model": "a", "model": "b"}', "more than once"),
    (b'{"mo\\u0064el": "a", "model": "b"}', "more than once"),
    (b'[{"model": "a"}]', "expected a JSON object"),
    (b'"model"', "expected a JSON object"),
    (b'{"model": "a"} {"model": "b"}', "extra data"),
    (b'{"model": "a",}', "member name"),
    (b'{"model" "a"}', "':'"),
    (b'\xff{"model": "a"}', "not UTF-8"),
    (b"[" * 5000 + b"]" * 5000, "JSON object"),
    (b'{"x": ' + b"[" * 5000 + b"]" * 5000 + b"}", "nested too deeply"),
    (b'{"x": ' + b'{"y": ' * 5000 + b"1" + b"}" * 5001, "nested too deeply"),
    (b'{"x": ' + b"9" * 5000 + b"}", "JSON"),  # past Python's digit limit for int()
    # A raw control character is refused in a key as in a value, small body or large.
    (b'{"a\tb": 1}', "control character"),
    (b'{"model": "a", "a\x01b": 1}', "control character"),
    (b'{"a\tb": 1, ' + b", ".join(b'"k%d": {"x": 1}' % i for i in range(20)) + b"}",
     "control character"),
])
def test_what_is_not_one_json_object_of_unique_keys_and_finite_numbers_is_refused(raw, says):
    error = refused(raw).error
    assert error.status == 400 and error.code == "invalid_json"
    assert says in error.message


def test_a_duplicate_names_its_member_as_the_param():
    assert refused(b'{"stream": true, "model": "x", "stream": false}').error.param == "stream"


def test_a_large_body_of_too_many_values_is_a_413_before_it_is_parsed():
    raw = b'{"input": [' + b"{}," * (MAX_ELEMENTS + 10) + b"{}]}"
    error = refused(raw).error
    assert error.status == 413 and error.code == "too_many_elements"


def test_commas_inside_strings_do_not_count_as_values():
    text = "a," * (MAX_ELEMENTS + 10)
    assert parse_body(json.dumps({"prompt": text}).encode()).payload["prompt"] == text


def test_a_byte_order_mark_is_read_past_and_never_passed_on():
    body = parse_body(b'\xef\xbb\xbf{"model": "a"}')
    assert body.payload == {"model": "a"}
    assert body.encode(body.payload) == b'{"model": "a"}'
    assert body.encode({**body.payload, "model": "b"}) == b'{"model": "b"}'


def test_a_lone_surrogate_is_carried_as_its_escape_when_its_member_changes_or_not():
    raw = b'{"model": "alias", "messages": [{"role": "user", "content": "\\ud800"}]}'
    body = parse_body(raw)
    assert body.payload["messages"][0]["content"] == "\ud800"
    changed = body.encode({**body.payload, "model": "served"})
    assert changed == raw.replace(b'"alias"', b'"served"')
    messages = [*body.payload["messages"], {"role": "assistant", "content": "x"}]
    rewritten = body.encode({**body.payload, "messages": messages})
    assert b'"\\ud800"' in rewritten  # re-written as ASCII: the escape, never a raw surrogate
    assert rewritten.decode() and json.loads(rewritten)["messages"] == messages


def test_members_are_replaced_where_they_stand_and_added_at_the_end():
    raw = b' { "model" : "a" ,\n "temperature": 0.70, "x": {"y": [1, 2.50]} }\n'
    body = parse_body(raw)
    assert body.encode({**body.payload, "model": "b"}) == raw.replace(b'"a"', b'"b"')
    added = body.encode({**body.payload, "priority": -1})
    assert added == (b' { "model" : "a" ,\n "temperature": 0.70, "x": {"y": [1, 2.50]} '
                     b',"priority":-1}\n')
    assert json.loads(added) == {**body.payload, "priority": -1}
    empty = parse_body(b"{}")
    assert empty.encode({"model": "m"}) == b'{"model":"m"}'


_KEYS = st.text(max_size=8)
_SCALARS = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
            | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12))
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=4)
                       | st.dictionaries(_KEYS, inner, max_size=4), max_leaves=20)
_OBJECTS = st.dictionaries(_KEYS, _VALUES, max_size=6)


@settings(max_examples=300, deadline=None)
@given(obj=_OBJECTS, indent=st.sampled_from([None, 1, "\t"]), ascii_only=st.booleans(),
       new_model=st.text(max_size=10))
def test_any_object_reads_back_as_itself_and_a_changed_model_changes_nothing_else(
        obj, indent, ascii_only, new_model):
    if "model" in obj:  # first: its value is then the text's first "model" member
        obj = {"model": obj["model"], **obj}
    raw = json.dumps(obj, indent=indent, ensure_ascii=ascii_only).encode()
    body = parse_body(raw)
    assert body.payload == obj
    assert parse_body(raw, sliced=True).payload == obj  # a large body's reading: the same
    assert body.encode(body.payload) is body.raw
    encoded = body.encode({**body.payload, "model": new_model})
    assert json.loads(encoded) == {**obj, "model": new_model}
    # Every other byte is the caller's: the new value stands where the old one stood, or is
    # added before the closing brace.
    new = json.dumps(new_model)
    text, sent = raw.decode(), encoded.decode()
    if "model" in obj:
        start = text.index('"model": ') + len('"model": ')
        _old, end = json.JSONDecoder().raw_decode(text, start)
        assert sent == text[:start] + new + text[end:]
    else:
        close = text.rindex("}")
        separator = "," if obj else ""
        assert sent == text[:close] + separator + '"model":' + new + text[close:]


@settings(max_examples=300, deadline=None)
@given(first=_VALUES, second=_VALUES, key=_KEYS)
def test_any_object_with_a_repeated_key_is_refused(first, second, key):
    name = json.dumps(key).encode()
    raw = b"{%s: %s, %s: %s}" % (name, json.dumps(first).encode(),
                                 name, json.dumps(second).encode())
    assert refused(raw).error.param == key


@pytest.mark.parametrize("messages", [1, 12, 400])
def test_a_key_repeated_inside_a_member_is_carried_as_sent_small_body_or_large(messages):
    # Only a top-level key is the gateway's to refuse; one repeated inside a message goes on
    # as the caller sent it, whichever way the body is read (whole, walked, sliced).
    message = b'{"role": "user", "content": "a", "content": "b"}'
    raw = b'{"model": "m", "messages": [%s]}' % b", ".join([message] * messages)
    for sliced in (False, True):
        body = parse_body(raw, sliced)
        assert body.payload == json.loads(raw)
        assert body.encode(body.payload) is body.raw


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=64))
def test_any_bytes_are_read_or_refused_with_a_400_never_raised_otherwise(data):
    outcomes = []
    for sliced in (False, True):
        try:
            outcomes.append(parse_body(data, sliced).payload)
        except BodyError as exc:
            assert exc.error.status == 400
            outcomes.append(exc.error.message)
    # A small body is read whole, a sliced one member by member: the same payload or error.
    assert outcomes[0] == outcomes[1]
