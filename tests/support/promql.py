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


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (a Grafana label_values(selector, label) query too)."""
    query = _LABEL_VALUES.match(expr)
    if query:
        expr = query.group(1)
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

