"""The metric names a PromQL expression queries, found without a Prometheus (stdlib only).

A dashboard or a rule file that names a metric the exporters do not serve shows an empty
panel or an alert that never fires, and nothing says so. Listing the names each expression
selects lets a test compare them with what the kit's exporters really serve.

This is a scanner, not a parser: it reads the tokens of an expression and keeps the bare
identifiers that can only be metric selectors. String literals, label matcher blocks
`{...}` and range, subquery and offset brackets `[...]` are dropped whole, so a label value
or a duration never reads as a metric. Of what is left, an identifier is not a metric when
it is a keyword, an aggregation or a function name, when it is followed by `(` (a function
call), or when it is a label name listed in a `by`, `without`, `on`, `ignoring`,
`group_left` or `group_right` clause. The one name a label block can carry is kept: a
selector written `{__name__="up"}` queries `up`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

# Lowercase: PromQL reads its keywords in any case (`SUM BY (host)`). Function names are
# only functions when a `(` follows, which the scanner checks on its own; they are listed
# too so that a name like `time` is never reported as a metric.
NOT_METRICS = frozenset(
    {
        # Aggregations.
        "sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk",
        "quantile", "count_values", "limitk", "limit_ratio",
        # Grouping, vector matching, set and comparison keywords, modifiers.
        "by", "without", "on", "ignoring", "group_left", "group_right",
        "and", "or", "unless", "atan2", "bool", "offset",
        # Number literals that are spelled as words.
        "inf", "nan",
        # Functions.
        "abs", "absent", "absent_over_time", "avg_over_time", "ceil", "changes", "clamp",
        "clamp_max", "clamp_min", "count_over_time", "day_of_month", "day_of_week",
        "day_of_year", "days_in_month", "delta", "deriv", "end", "exp", "floor",
        "histogram_quantile", "hour", "idelta", "increase", "irate", "label_join",
        "label_replace", "last_over_time", "ln", "log10", "log2", "max_over_time",
        "min_over_time", "minute", "month", "predict_linear", "present_over_time",
        "quantile_over_time", "rate", "resets", "round", "scalar", "sgn", "sort",
        "sort_desc", "sqrt", "start", "stddev_over_time", "stdvar_over_time",
        "sum_over_time", "time", "timestamp", "vector", "year",
    }
)  # fmt: skip

# The clauses whose parenthesised list holds label names, not selectors.
LABEL_LIST_CLAUSES = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})

_STRING = r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`'
_TOKENS = re.compile(
    rf"""
    (?P<space>\s+|\#[^\n]*)
    |(?P<string>{_STRING})
    |(?P<duration>(?:\d+(?:ms|[smhdwy]))+)(?![\w:])
    |(?P<number>0[xX][0-9a-fA-F]+|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)
    |(?P<identifier>[a-zA-Z_:][a-zA-Z0-9_:]*)
    |(?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
# Inside a label block: a string whole, so that a `}`, `]` or `,` in a label value ends
# nothing, or any other one character.
_IN_BLOCK = re.compile(rf"{_STRING}|.", re.DOTALL)
# The matchers of a label block that name the metric: `__name__="up"` (an equality, not a
# regex match), or Prometheus 3's quoted name alone, `{"up"}`.
_NAME_MATCHER = re.compile(rf"\s*(?:__name__\s*=\s*)?({_STRING})\s*")
_CLOSING = {"{": "}", "[": "]"}


def metric_names(expr: str) -> set[str]:
    """The metric names EXPR selects: {'up'} for `count(up{job="x"} == 1)`."""
    tokens = list(_scan(expr))
    names: set[str] = set()
    depth = 0
    list_closes_at = None  # inside a clause's label-name list: the depth at which it closes
    for index, (kind, text) in enumerate(tokens):
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if kind == "other" and text == "(":
            depth += 1
        elif kind == "other" and text == ")":
            depth -= 1
            if depth == list_closes_at:
                list_closes_at = None
        elif kind == "name":
            names.add(text)
        elif kind == "identifier" and list_closes_at is None:
            word = text.lower()
            if word in LABEL_LIST_CLAUSES and following == "(":
                list_closes_at = depth
            elif word not in NOT_METRICS and following != "(":
                names.add(text)
    return names


def _scan(expr: str) -> Iterator[tuple[str, str]]:
    """EXPR's tokens as (kind, text), without blanks, comments, strings, numbers and
    durations; a label block or a bracket is dropped whole, except the metric name a label
    block may give (kind "name")."""
    position = 0
    while position < len(expr):
        if expr[position] in _CLOSING:
            opening = expr[position]
            matchers, position = _block(expr, position)
            if opening == "{":
                yield from (("name", name) for name in _names_in_label_block(matchers))
            continue
        match = _TOKENS.match(expr, position)
        assert match is not None  # `other` matches any one character
        position = match.end()
        if match.lastgroup in ("identifier", "other"):
            yield match.lastgroup, match.group()


def _block(expr: str, start: int) -> tuple[list[str], int]:
    """The comma-separated parts of the text between the bracket at START and its closing
    one (a label block's matchers), and where the block ends."""
    closing = _CLOSING[expr[start]]
    parts = [""]
    position = start + 1
    while position < len(expr) and expr[position] != closing:
        piece = _IN_BLOCK.match(expr, position).group()
        position += len(piece)
        if piece == ",":
            parts.append("")
        else:
            parts[-1] += piece
    return parts, position + 1


def _names_in_label_block(matchers: list[str]) -> Iterator[str]:
    for matcher in matchers:
        if match := _NAME_MATCHER.fullmatch(matcher):
            quoted = match.group(1)
            yield quoted[1:-1] if quoted[0] == "`" else re.sub(r"\\(.)", r"\1", quoted[1:-1])


def dashboard_expressions(dashboard: Mapping[str, Any]) -> list[str]:
    """Every query expression of a Grafana dashboard's panels (`targets[].expr`), the panels
    of collapsed rows included, in the order they appear."""
    return list(_panel_expressions(dashboard.get("panels") or []))


def _panel_expressions(panels: list[Mapping[str, Any]]) -> Iterator[str]:
    for panel in panels:
        for target in panel.get("targets") or []:
            if isinstance(target.get("expr"), str):
                yield target["expr"]
        yield from _panel_expressions(panel.get("panels") or [])


def rule_expressions(rules: Mapping[str, Any]) -> list[str]:
    """Every `expr` of a Prometheus rule file (recording and alerting rules), as loaded."""
    return [
        str(rule["expr"])
        for group in rules.get("groups") or []
        for rule in group.get("rules") or []
        if "expr" in rule
    ]
