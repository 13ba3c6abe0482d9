"""The metric names a PromQL expression (or a Grafana query holding one) selects.

    metric_names('sum by (box) (rate(lobes_gateway_requests_total{code=~"5.."}[5m]))')
    # {"lobes_gateway_requests_total"}

Strings, label matchers, ranges, grouping lists and Grafana variables hold label names and values,
not metric names, so they are taken out first; of the identifiers left, those followed by `(`
are functions or aggregations and the rest that are not keywords are metric names. A matcher on
`__name__` names a metric too.
"""

from __future__ import annotations

import re

# Operators and modifiers that read like identifiers (inf and nan are number literals).
KEYWORDS = frozenset({"and", "or", "unless", "by", "without", "on", "ignoring", "group_left",
                      "group_right", "bool", "offset", "inf", "nan"})
GROUPING = ("by", "without", "on", "ignoring", "group_left", "group_right")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUP_LIST = re.compile(rf"\b({'|'.join(GROUPING)})\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+|\[\[\w+\]\]")
# A number or duration (0.95, 1e3, 0x1f, 5m, 1h30m) is one token, so its unit is no name.
_TOKEN = re.compile(r"\d[\w.]*|[A-Za-z_:][\w:]*(?=(\s*\()?)")
_NAME_MATCHER = re.compile(r'__name__\s*=\s*"((?:[^"\\]|\\.)*)"')
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$", re.DOTALL)
_SELECTOR = re.compile(r"(?<![\w:])([A-Za-z_:][\w:]*)?\s*\{([^{}]*)\}")
_MATCHER_LABEL = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")


def _promql(expr: str) -> str:
    """The PromQL of a Grafana query: label_values(selector, label) is its selector."""
    query = _LABEL_VALUES.match(expr)
    return query.group(1) if query else expr


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (a Grafana label_values(selector, label) query too)."""
    expr = _promql(expr)
    names = set(_NAME_MATCHER.findall(expr))
    blanked = _STRING.sub('""', expr)
    blanked = _VARIABLE.sub(" ", blanked)
    blanked = _MATCHERS.sub(" ", blanked)
    blanked = _RANGE.sub(" ", blanked)
    blanked = _GROUP_LIST.sub(" ", blanked)
    for match in _TOKEN.finditer(blanked):
        token, call = match.group(0), match.group(1)
        if token[0].isdigit() or call or token.lower() in KEYWORDS:
            continue
        names.add(token)
    return names


def label_names(expr: str) -> tuple[dict[str, set[str]], set[str]]:
    """The label names `expr` matches on, per metric name, and those it groups or joins by."""
    blanked = _VARIABLE.sub(" ", _STRING.sub('""', _promql(expr)))
    matched: dict[str, set[str]] = {}
    for name, body in _SELECTOR.findall(blanked):
        labels = set(_MATCHER_LABEL.findall(body)) - {"__name__"}
        if name and name.lower() not in KEYWORDS:
            matched.setdefault(name, set()).update(labels)
    grouped = set()
    for match in _GROUP_LIST.finditer(_MATCHERS.sub(" ", blanked)):
        inside = match.group(0)[match.group(0).index("(") + 1:-1]
        grouped.update(label.strip() for label in inside.split(",") if label.strip())
    return matched, grouped
