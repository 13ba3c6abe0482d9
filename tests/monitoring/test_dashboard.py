"""The Grafana dashboard the monitoring role ships: it parses strictly into Grafana's own dashboard
model (grafana-foundation-sdk), Prometheus's parser accepts every query in it, and every metric
its queries and the alert rules select is one a real gateway and its real gears export (scraped
here after traffic), so a renamed metric breaks this test instead of the operator's dashboard."""

from __future__ import annotations

import copy
import enum
import json
import re
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
import typeguard
import yaml
from grafana_foundation_sdk.cog import encoder, plugins
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.models import dashboard as grafana
from grafana_foundation_sdk.models import prometheus
from hypothesis import given
from hypothesis import strategies as st

from tests.support.client import call, chat
from tests.support.gateway_proc import start_gateway
from tests.support.metrics import PROMTOOL, PROMTOOL_MISSING, Scrape
from tests.support.promql import KEYWORDS, label_names, metric_names
from tests.support.sim_proc import start_sim
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "roles" / "monitoring" / "files"
DASHBOARD = FILES / "lobes-fleet-dashboard.json"
RULES = FILES / "lobes-fleet.rules.yml"
SERVED = "served-cortex"
# Series Prometheus itself adds to every target it scrapes, beside what the target exports.
PROMETHEUS_SERIES = frozenset({"up", "scrape_duration_seconds", "scrape_samples_scraped",
                               "scrape_samples_post_metric_relabeling", "scrape_series_added"})
# The labels the monitoring role's scrape configuration gives each target's series.
GATEWAY_TARGET_LABELS = frozenset({"job", "instance", "box"})
GEAR_TARGET_LABELS = GATEWAY_TARGET_LABELS | {"role"}
SDK_MODULE = "grafana_foundation_sdk."

plugins.register_default_plugins()


# --- the dashboard against Grafana's dashboard model ---------------------------------------


def dropped_fields(given_json: object, parsed_json: object, path: str = "$") -> Iterator[str]:
    """Paths of `given_json` the model did not keep or changed: fields the schema lacks."""
    if isinstance(given_json, dict) and isinstance(parsed_json, dict):
        for key, value in given_json.items():
            if key not in parsed_json:
                yield f"{path}.{key}: not a field of the schema"
            else:
                yield from dropped_fields(value, parsed_json[key], f"{path}.{key}")
    elif isinstance(given_json, list) and isinstance(parsed_json, list) \
            and len(given_json) == len(parsed_json):
        for index, (value, kept) in enumerate(zip(given_json, parsed_json, strict=True)):
            yield from dropped_fields(value, kept, f"{path}[{index}]")
    elif given_json != parsed_json or type(given_json) is not type(parsed_json):
        yield f"{path}: {given_json!r} read back as {parsed_json!r}"


def fits(value: object, hint: object) -> bool:
    """`value` is of the model's type `hint` (an enum field may hold the enum's raw value)."""
    if typing.get_origin(hint) is typing.Union:
        return any(fits(value, member) for member in typing.get_args(hint))
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return isinstance(value, hint) or value in {member.value for member in hint}
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return isinstance(value, list) and all(fits(each, item) for each in value)
    try:
        typeguard.check_type(value, hint,
                             collection_check_strategy=typeguard.CollectionCheckStrategy.ALL_ITEMS)
    except typeguard.TypeCheckError:
        return False
    return True


def mistyped_fields(model: object, path: str = "$") -> Iterator[str]:
    """Paths of the parsed model whose values are not of the type the schema gives them."""
    if isinstance(model, list):
        for index, item in enumerate(model):
            yield from mistyped_fields(item, f"{path}[{index}]")
        return
    opaque = (enum.Enum, cogruntime.UnknownDataquery)
    if not type(model).__module__.startswith(SDK_MODULE) or isinstance(model, opaque):
        return
    for name, hint in typing.get_type_hints(type(model)).items():
        value = getattr(model, name)
        if not fits(value, hint):
            yield f"{path}.{name}: {value!r} is not {hint}"
        yield from mistyped_fields(value, f"{path}.{name}")


def schema_problems(data: dict) -> list[str]:
    """What Grafana's dashboard schema refuses in `data` (an empty list when it takes it)."""
    model = grafana.Dashboard.from_json(data)
    read_back = json.loads(json.dumps(model, cls=encoder.JSONEncoder))
    return [*dropped_fields(data, read_back), *mistyped_fields(model)]


@pytest.fixture(scope="module")
def board() -> dict:
    return json.loads(DASHBOARD.read_text())


def test_the_dashboard_is_taken_whole_by_grafanas_dashboard_schema(board):
    assert schema_problems(board) == []


def test_panels_are_grafana_panels_of_prometheus_queries_on_the_chosen_source(board):
    model = grafana.Dashboard.from_json(board)
    variables = {variable.name: variable for variable in model.templating.list_val or []}
    source = variables["datasource"]
    assert (source.type_val, source.query) == ("datasource", "prometheus")
    chosen = grafana.DataSourceRef(type_val="prometheus", uid="${datasource}")
    assert model.panels
    for panel in model.panels:
        config = cogruntime.panelcfg_config(panel.type_val)
        assert config is not None, f"{panel.title}: {panel.type_val} is no Grafana panel"
        assert type(panel.options).__module__.startswith(SDK_MODULE), panel.title
        assert vars(panel.datasource) == vars(chosen), panel.title
        assert panel.targets, panel.title
        refs = [target.ref_id for target in panel.targets]
        assert len(set(refs)) == len(refs), panel.title
        for target in panel.targets:
            assert isinstance(target, prometheus.Dataquery), panel.title
            assert vars(target.datasource) == vars(chosen), panel.title
            assert target.expr.strip(), panel.title
        assert panel.grid_pos.x >= 0 and panel.grid_pos.x + panel.grid_pos.w <= 24, panel.title
    assert len({panel.id_val for panel in model.panels}) == len(model.panels)


def _renamed_field(data: dict) -> None:
    data["panels"][0]["gridPos"]["height"] = data["panels"][0]["gridPos"].pop("h")


def _unknown_dashboard_field(data: dict) -> None:
    data["refreshEvery"] = "30s"


def _unknown_target_field(data: dict) -> None:
    data["panels"][1]["targets"][0]["query"] = data["panels"][1]["targets"][0]["expr"]


def _bad_enum(data: dict) -> None:
    data["panels"][0]["options"]["legend"]["displayMode"] = "lst"


def _bad_type(data: dict) -> None:
    data["panels"][2]["gridPos"]["w"] = "12"


def _bad_variable_hide(data: dict) -> None:
    data["templating"]["list"][1]["hide"] = 5


@pytest.mark.parametrize(("spoil", "where"), [
    (_renamed_field, "$.panels[0].gridPos.height: not a field"),
    (_unknown_dashboard_field, "$.refreshEvery: not a field"),
    (_unknown_target_field, "$.panels[1].targets[0].query: not a field"),
    (_bad_enum, "$.panels[0].options.legend.display_mode: 'lst' is not"),
    (_bad_type, "$.panels[2].grid_pos.w: '12' is not"),
    (_bad_variable_hide, "$.templating.list_val[1].hide: 5 is not"),
])
def test_the_schema_check_refuses_a_spoilt_dashboard(board, spoil, where):
    spoilt = copy.deepcopy(board)
    spoil(spoilt)
    problems = schema_problems(spoilt)
    assert len(problems) == 1 and problems[0].startswith(where), problems


# --- the metric names the dashboard and the rules select -----------------------------------


def dashboard_queries(data: dict) -> list[tuple[str, str]]:
    """(where, query) for every target of every panel and every query variable."""
    queries = [(f"panel {panel['title']!r} {target['refId']}", target["expr"])
               for panel in data["panels"] for target in panel["targets"]]
    for variable in data["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            queries.append((f"variable {variable['name']}",
                            query["query"] if isinstance(query, dict) else query))
    return queries


def rule_queries() -> tuple[list[tuple[str, str]], set[str]]:
    """(where, expr) of every rule of the rules file, and the names its recording rules define."""
    rules = [rule for group in yaml.safe_load(RULES.read_text())["groups"]
             for rule in group["rules"]]
    queries = [(rule.get("alert") or rule["record"], rule["expr"]) for rule in rules]
    return queries, {rule["record"] for rule in rules if "record" in rule}


def unknown_metrics(queries: list[tuple[str, str]], exported: set[str]) -> dict[str, set[str]]:
    """Per query, the metric names it selects that nothing exports (every query selects one)."""
    unknown = {}
    for where, expr in queries:
        names = metric_names(expr)
        missing = names - exported if names else {"<no metric at all>"}
        if missing:
            unknown[where] = missing
    return unknown


@pytest.fixture(scope="module")
def mesh_box():
    """A box as the plan makes one: a pooled cortex (its own gear and a peer's) and an embedder."""
    with start_sim("instant", served_name=SERVED) as gear, \
            start_sim("instant", served_name=SERVED) as peer_gear, \
            start_sim("embedder", served_name="served-embedder") as embedder, \
            start_gateway({"PRIMARY_BASE_URL": peer_gear.url,
                           "PRIMARY_SERVED_NAME": SERVED}) as peer:
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": SERVED,
               "PRIMARY_PEER_ORIGINS": peer.url, "GATEWAY_PROBE_INTERVAL_S": "0.2",
               "EMBED_BASE_URL": embedder.url, "EMBED_SERVED_NAME": "served-embedder"}
        with start_gateway(env) as gateway:
            yield gateway, (gear, peer_gear)


def drive_traffic(gateway, gears) -> None:
    """What makes lazily created series appear: chats, a stream, an embedding, a failover."""
    wait_until(lambda: Scrape.of(gateway.url).value("lobes_gateway_pool_replica_ready",
                                                    role="cortex") == 2,
               message="both cortex replicas probed ready")
    assert chat(gateway.url, {"model": "main"}).status == 200
    stream = chat(gateway.url, {"model": "main", "stream": True,
                                "stream_options": {"include_usage": True}})
    assert stream.status == 200
    embedding = call(gateway.url, "POST", "/v1/embeddings",
                     {"model": "embedder", "input": "a few words"})
    assert embedding.status == 200, embedding.body
    # With both replicas failing, a request leaves the first for the second: a failover.
    for gear in gears:
        gear.set_faults({"error_status": 503})
    try:
        wait_until(lambda: (chat(gateway.url, {"model": "main"}).status != 200
                            and Scrape.of(gateway.url).value(
                                "lobes_gateway_upstream_failovers_total") > 0),
                   message="a failover counted")
    finally:
        for gear in gears:
            gear.set_faults({})


@pytest.fixture(scope="module")
def scrapes(mesh_box) -> dict[str, Scrape]:
    """The gateway's /metrics and each gear's as the gateway relays it, after traffic."""
    gateway, gears = mesh_box
    drive_traffic(gateway, gears)
    found = {"gateway": Scrape.of(gateway.url)}
    for role in ("cortex", "embedder"):
        reply = call(gateway.url, "GET", f"/metrics/gears/{role}")
        assert reply.status == 200, reply.body
        found[role] = Scrape.from_text(reply.body.decode(), reply.headers["content-type"])
    return found


@pytest.fixture(scope="module")
def exported(scrapes) -> set[str]:
    """Every series name Prometheus holds of a box: its scrapes' and its own per target."""
    return {sample[0] for scrape in scrapes.values() for sample in scrape.samples} \
        | PROMETHEUS_SERIES


@pytest.fixture(scope="module")
def labelled(scrapes) -> dict[str, set[str]]:
    """Per series name, the label names Prometheus holds it with: exported and the target's."""
    labels: dict[str, set[str]] = {name: set(GEAR_TARGET_LABELS) for name in PROMETHEUS_SERIES}
    for source, scrape in scrapes.items():
        target = GATEWAY_TARGET_LABELS if source == "gateway" else GEAR_TARGET_LABELS
        for name, exported_labels, _value in scrape.samples:
            labels.setdefault(name, set(target)).update(exported_labels)
    return labels


def unknown_labels(queries: list[tuple[str, str]],
                   labelled: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per query, the label names it matches or groups on that its series do not carry."""
    unknown = {}
    for where, expr in queries:
        matched, grouped = label_names(expr)
        carried = set().union(*(labelled.get(name, set()) for name in metric_names(expr)))
        missing = {f"{name}{{{label}}}" for name, labels in matched.items()
                   for label in labels - labelled.get(name, set())}
        missing |= {f"by {label}" for label in grouped - carried}
        if missing:
            unknown[where] = missing
    return unknown


def test_the_scrapes_hold_gateway_and_gear_series(scrapes, exported):
    assert "lobes_gateway_upstream_failovers_total" in exported
    assert "lobes_gateway_pool_replica_ready" in exported
    assert {"vllm:num_requests_running", "vllm:num_requests_waiting"} <= \
        {sample[0] for sample in scrapes["cortex"].samples}
    if PROMTOOL is None:
        pytest.skip(PROMTOOL_MISSING)
    assert scrapes["gateway"].promtool_problems() == ""


def test_every_dashboard_query_selects_exported_metrics(board, exported):
    recorded = rule_queries()[1]
    assert unknown_metrics(dashboard_queries(board), exported | recorded) == {}


def test_every_rule_selects_exported_metrics(exported):
    queries, recorded = rule_queries()
    assert unknown_metrics(queries, exported | recorded) == {}


def test_every_dashboard_query_matches_and_groups_on_labels_its_series_carry(board, labelled):
    assert unknown_labels(dashboard_queries(board), labelled) == {}


def test_every_rule_matches_and_groups_on_labels_its_series_carry(labelled):
    queries = rule_queries()[0]
    assert unknown_labels(queries, labelled) == {}


def test_a_dashboard_with_a_renamed_label_is_refused(board, labelled):
    renamed = json.loads(DASHBOARD.read_text().replace('outcome=\\"answered\\"',
                                                       'result=\\"answered\\"')
                         .replace("route_reason)", "reason_of_route)"))
    assert unknown_labels(dashboard_queries(renamed), labelled) == {
        "panel 'Placement split: answers by target' A":
            {"lobes_gateway_upstream_attempts_total{result}"},
        "panel 'Placement split: requests by role and route reason' A": {"by reason_of_route"}}


def test_a_dashboard_with_a_renamed_metric_is_refused(board, exported):
    renamed = json.loads(DASHBOARD.read_text().replace(
        "lobes_gateway_completion_tokens_total", "lobes_gateway_generated_tokens_total"))
    assert unknown_metrics(dashboard_queries(renamed), exported) == {
        "panel 'Throughput: completion tokens/s per box' A":
            {"lobes_gateway_generated_tokens_total"}}


def test_a_histogram_is_selected_by_its_series_not_its_family_name(exported):
    family = [("p95", "histogram_quantile(0.95, sum by (le) "
                      "(rate(lobes_gateway_request_duration_seconds[5m])))")]
    assert unknown_metrics(family, exported) == {
        "p95": {"lobes_gateway_request_duration_seconds"}}


def as_prometheus(query: str) -> str:
    """A Grafana query as Prometheus reads it: variables set, label_values(...) to its selector."""
    selector = re.match(r"^label_values\((.*),\s*\w+\)$", query.strip(), re.DOTALL)
    query = selector.group(1) if selector else query
    query = re.sub(r"\$__\w+|\$\{__\w+\}", "5m", query)
    return re.sub(r"\$\{\w+\}|\$\w+", "box", query)


def test_prometheus_parses_every_dashboard_query(board, tmp_path):
    if PROMTOOL is None:
        pytest.skip(PROMTOOL_MISSING)
    queries = dashboard_queries(board)
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{index}", "expr": as_prometheus(query)}
        for index, (_where, query) in enumerate(queries)]}]}
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(queries)} rules found" in done.stdout


# --- the extractor itself ------------------------------------------------------------------


@pytest.mark.parametrize(("expr", "names"), [
    ('sum by (box) (rate(lobes_gateway_requests_total{code=~"5..", box=~"$box"}'
     "[$__rate_interval]))", {"lobes_gateway_requests_total"}),
    ('up{job="lobes-gear"} == 0 unless on(box) up{job="lobes-gateway"} == 0', {"up"}),
    ("histogram_quantile(0.95, sum(rate(a_bucket[5m] offset 1h)) by (le, box))", {"a_bucket"}),
    ('label_values(up{job="lobes-gateway"}, box)', {"up"}),
    ('{__name__="foo", a="rate(bar)"} / ignoring(x) group_left(y) baz', {"foo", "baz"}),
    ("vllm:num_requests_running > bool 1e3 and vllm:num_requests_waiting offset 5m",
     {"vllm:num_requests_running", "vllm:num_requests_waiting"}),
    ("max_over_time(rate(x_total[5m:1m] @ start())[1h:])", {"x_total"}),
    ("sum without (instance) (a) / on (box) group_right b or c unless d", {"a", "b", "c", "d"}),
    ("count(inf) + nan + 0x1F + 1h30m", set()),
    ('rate(  spaced_total { a = "}" } [ 5m ] )', {"spaced_total"}),
])
def test_the_extractor_names_the_metrics_of(expr, names):
    assert metric_names(expr) == names


_IDENT = st.from_regex(r"[a-z_][a-z0-9_:]{0,12}", fullmatch=True).filter(
    lambda name: name not in KEYWORDS)
_LABEL = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_VALUE = st.text(st.sampled_from('abc(){}[]," \\=~:5m$'), max_size=12)


@st.composite
def selectors(draw) -> tuple[str, str]:
    """A random selector with hostile label values, and the metric name it selects."""
    name = draw(_IDENT)
    matchers = draw(st.lists(st.tuples(_LABEL, st.sampled_from(["=", "!=", "=~", "!~"]), _VALUE),
                             max_size=3))
    body = ", ".join(f'{label}{op}{json.dumps(value)}' for label, op, value in matchers)
    text = f"{name}{{{body}}}" if matchers or draw(st.booleans()) else name
    if draw(st.booleans()):
        text = f"rate({text}[{draw(st.sampled_from(['5m', '$__rate_interval', '1h30m']))}])"
    return text, name


@given(st.lists(selectors(), min_size=1, max_size=4),
       st.lists(_LABEL, min_size=1, max_size=3),
       st.sampled_from(["sum", "max", "count", "avg"]),
       st.sampled_from(["by", "without"]),
       st.sampled_from([" + ", " / on(box) ", " and ", " unless ignoring(x) ", " > bool "]))
def test_the_extractor_finds_exactly_the_selected_metrics(
        picked, labels, aggregation, grouping, operator):
    parts = [f"{aggregation} {grouping} ({', '.join(labels)}) ({text})" for text, _name in picked]
    expr = operator.join(parts)
    assert metric_names(expr) == {name for _text, name in picked}
