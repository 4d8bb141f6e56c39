"""A role's numbers and switches as their argument specs declare them: `-e name=3` gives
the string "3", which must multiply and compare as 3 (socketwise.common.typed)."""

import pytest

from socketwise.common.typed import convert, declared_types, type_errors, typed


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("3", "int", 3),
        (" 600 ", "int", 600),
        ("-1", "int", -1),
        (5, "int", 5),
        (4.0, "int", 4),
        ("0.25", "float", 0.25),
        ("2", "float", 2.0),
        (1, "float", 1.0),
        ("yes", "bool", True),
        ("False", "bool", False),
        ("0", "bool", False),
        (1, "bool", True),
        (True, "bool", True),
        (None, "int", None),
    ],
)
def test_a_value_as_given_becomes_its_type(value, kind, expected):
    converted = convert(value, kind)
    assert converted == expected and type(converted) is type(expected)


def test_a_value_that_does_not_spell_its_type_is_named_with_the_value():
    types = {"a": "int", "b": "bool", "c": "float", "d": "int"}
    given = {"a": "ten", "b": "maybe", "c": "fast", "d": "4.5"}
    assert type_errors(given, types) == [
        "a='ten': is not a whole number",
        "b='maybe': is not a boolean; give true or false",
        "c='fast': is not a number",
        "d='4.5': is not a whole number",
    ]
    # Left as given (play 1 stops on it), never silently 0 as `| int` would make it.
    assert typed(given, types) == given
    assert type_errors({"a": True}, types) == ["a=True: is a boolean, not an integer"]


def test_the_types_come_from_the_roles_argument_specs():
    types = declared_types()
    assert types["vllm_service_start_limit_burst"] == "int"
    assert types["vllm_service_allow_anonymous"] == "bool"
    assert types["cluster_ctx_size"] == "int"
    assert "vllm_home" not in types, "strings and paths are not converted"
