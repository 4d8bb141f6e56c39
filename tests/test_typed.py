"""A role's numbers and switches as their argument specs declare them: `-e name=3` gives
the string "3", which must multiply and compare as 3 (socketwise.common.typed)."""

import pytest
from ansible.errors import AnsibleFilterError

from socketwise.common.typed import convert, declared_types, type_errors, typed

from .playbooks import kit_plugin


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
        (0, "bool", False),
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
    assert types["credentials_allow_anonymous"] == "bool"
    assert types["cluster_ctx_size"] == "int"
    assert "vllm_home" not in types, "strings and paths are not converted"


@pytest.mark.parametrize(
    ("value", "kind", "wrong"),
    [
        (2, "bool", "is not a boolean; give true or false"),
        (-1, "bool", "is not a boolean; give true or false"),
        (0.5, "bool", "is not a boolean; give true or false"),
        (4.5, "int", "is not a whole number"),
        ("yes", "int", "is not a whole number"),
        ("off", "int", "is not a whole number"),
        (True, "float", "is a boolean, not a number"),
        # A threshold of nan or inf never trips: an alert on it would never fire.
        ("nan", "float", "is not a finite number"),
        ("inf", "float", "is not a finite number"),
        ("-1e999", "float", "is not a finite number"),
        (float("inf"), "float", "is not a finite number"),
    ],
)
def test_a_value_that_only_resembles_its_type_is_refused_not_rounded_or_guessed(value, kind, wrong):
    # A switch set to 2, a count of 4.5 or "yes" as a count is a typo: play 1 names it,
    # the role never runs with True, 4 or 1 in its place.
    assert type_errors({"x": value}, {"x": kind}) == [f"x={value!r}: {wrong}"]
    assert typed({"x": value}, {"x": kind}) == {"x": value}


def test_a_role_that_converts_a_variable_no_spec_declares_as_a_number_stops_naming_it():
    filters = kit_plugin("filter.typed").FilterModule().filters()
    given = {"vllm_service_start_limit_burst": "5", "vllm_home": "/opt/vllm"}
    for door in ("typed", "type_errors"):
        with pytest.raises(
            AnsibleFilterError, match="no int, float or bool argument spec for vllm_home$"
        ):
            filters[door](given)
    assert filters["typed"]({"vllm_service_start_limit_burst": "5"}) == {
        "vllm_service_start_limit_burst": 5
    }
