"""The live page /ui in a real headless Chromium against real gateways and simulators: it loads
with no console error and no request off the gateway's origin, shows every role ready, shows
hostile names as text, asks for the key when the status is private, and says when it is stale."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from tests.support import browser as ui
from tests.support.gateway_proc import start_gateway
from tests.support.sim_proc import start_sim

KEY = "ui-test-key"
# Markup in a served name: the page must show it as these characters, never run it.
HOSTILE = "sim<img src=x onerror=alert(1)>"
PEER_HOSTILE = "peer<script>document.title='owned'</script>"
# What the plan renders of a box's hardware, with markup in it: shown as text, here and at peers.
HARDWARE = "Spark <b>bold</b>"
PEER_HARDWARE = "Thor<svg onload=document.title='owned'>"
# The gears table's "generated tok/s" column.
GENERATED_COLUMN = 8
SCREENSHOTS = os.environ.get("LOBES_UI_SCREENSHOTS")


@pytest.fixture(scope="module")
def driver():
    with ui.browser() as chromium:
        yield chromium


@pytest.fixture(scope="module")
def hostile_mesh():
    """Box A serves cortex from a gear with a hostile name and proxies senses to box B, whose
    gear advertises another hostile name (A refuses to repeat it: incompatible, and why)."""
    with start_sim("instant", served_name=HOSTILE) as gear, \
            start_sim("instant", served_name=PEER_HOSTILE) as peer_gear, \
            start_gateway({"PRIMARY_BASE_URL": peer_gear.url, "PRIMARY_SERVED_NAME": PEER_HOSTILE,
                           "MULTIMODAL_BASE_URL": peer_gear.url,
                           "MULTIMODAL_SERVED_NAME": PEER_HOSTILE,
                           "GATEWAY_BOX_HARDWARE": PEER_HARDWARE}) as peer:
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": HOSTILE,
               "GATEWAY_BOX_HARDWARE": HARDWARE, "GATEWAY_GEAR_SHARES_GIB": "38.4",
               "GATEWAY_MEMORY_HEADROOM_GIB": "0.5",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_ROUTE": "proxy",
               "MULTIMODAL_PEER_ORIGIN": peer.url, "GATEWAY_PROBE_INTERVAL_S": "0.5"}
        with start_gateway(env) as gateway:
            yield gateway, peer


@pytest.fixture(scope="module")
def full_box():
    """One box serving every role it can from simulators, as the local default does."""
    with start_sim("instant", served_name="cortex-sim") as cortex, \
            start_sim("instant", served_name="senses-sim") as senses, \
            start_sim("embedder", served_name="embed-sim") as embed, \
            start_sim("reranker", served_name="rerank-sim") as rerank:
        env = {"PRIMARY_BASE_URL": cortex.url, "PRIMARY_SERVED_NAME": "cortex-sim",
               "MULTIMODAL_BASE_URL": senses.url, "MULTIMODAL_SERVED_NAME": "senses-sim",
               "EMBED_BASE_URL": embed.url, "EMBED_SERVED_NAME": "embed-sim",
               "RERANK_BASE_URL": rerank.url, "RERANK_SERVED_NAME": "rerank-sim"}
        with start_gateway(env) as gateway:
            yield gateway


def _open(driver, url: str) -> None:
    """Load the page afresh, its logs emptied first."""
    driver.get("about:blank")
    driver.get_log("browser")
    driver.get_log("performance")
    driver.get(url)


def test_page_carries_a_strict_policy_and_ships_no_foreign_reference(full_box):
    with urllib.request.urlopen(full_box.url + "/ui", timeout=10) as answer:
        policy = answer.headers["Content-Security-Policy"]
        assert answer.headers["X-Content-Type-Options"] == "nosniff"
        html = answer.read().decode()
    assert "default-src 'none'" in policy and "script-src 'self'" in policy
    assert "connect-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert "<script>" not in html and "style=" not in html and "http" not in html.split("<body>")[1]


def test_every_served_role_ready_no_console_error_no_foreign_request(driver, full_box):
    _open(driver, full_box.url + "/ui")
    ui.wait_live(driver)
    roles = ui.wait_for(driver, lambda d: ui.rows(d, "roles", "data-role") or None,
                        "the roles table")
    for role in ("cortex", "senses", "embedder", "reranker"):
        assert roles[role]["ready"] == "true", roles[role]
    gears = ui.rows(driver, "gears", "data-gear")
    assert {name for name, row in gears.items() if row["ready"] == "true"} >= {
        "cortex", "senses", "embedder", "reranker"}
    assert "0.23" in gears["cortex"]["text"]  # the engine's own /version
    assert ui.console_errors(driver) == []
    urls = ui.requested_urls(driver)
    assert any(url.endswith("/status") for url in urls)
    assert ui.foreign(urls, full_box.url) == []
    if SCREENSHOTS:
        driver.save_screenshot(str(Path(SCREENSHOTS) / "live-page-box.png"))


def test_the_chart_keeps_a_history_and_rates_follow_traffic(driver, full_box):
    _open(driver, full_box.url + "/ui")
    ui.wait_live(driver)
    request = urllib.request.Request(
        full_box.url + "/v1/chat/completions", method="POST",
        data=b'{"model":"cortex-sim","max_tokens":64,"messages":[{"role":"user","content":"hi"}]}',
        headers={"Content-Type": "application/json"})
    for _attempt in range(5):
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200

    def generating(d):
        generated = ui.rows(d, "gears", "data-gear")["cortex"]["cells"][GENERATED_COLUMN]
        return generated.replace(".", "", 1).isdigit() and float(generated) > 0
    ui.wait_for(driver, generating, "the cortex gear's generated tokens/s to rise")
    points = driver.find_element(By.CSS_SELECTOR, "svg.chart[data-role='cortex'] polyline.tps")
    assert len(points.get_attribute("points").split()) >= 2
    ttft = ui.rows(driver, "ttft", "data-role")
    assert "cortex" in ttft


def test_hostile_names_are_shown_as_text_and_never_run(driver, hostile_mesh):
    gateway, peer = hostile_mesh
    _open(driver, gateway.url + "/ui")
    ui.wait_live(driver)
    ui.wait_for(driver, lambda d: "holds a character it may not" in ui.rows(
        d, "roles", "data-role").get("senses", {}).get("text", ""),
        "why the peer with a hostile served name is not used, in the roles table")
    ui.wait_for(driver, lambda d: PEER_HARDWARE in d.find_element(By.TAG_NAME, "body").text,
                "the peer's hardware drawn on its box, as text")
    page = driver.find_element(By.TAG_NAME, "body").text
    assert HOSTILE in page and PEER_HOSTILE not in page
    assert HARDWARE in page and "gears' shares 38.4 GiB, headroom kept 0.5 GiB" in page
    assert driver.find_elements(By.CSS_SELECTOR, "main img, main script, main b") == []
    assert driver.title != "owned"
    drawn = ui.links(driver)
    assert {"role": "senses", "origin": peer.url, "state": "incompatible"} in drawn
    assert ui.console_errors(driver) == []
    assert ui.foreign(ui.requested_urls(driver), gateway.url) == []


def test_a_dead_peer_link_is_drawn_unreachable_and_the_page_goes_stale(driver):
    with start_sim("instant", served_name="p") as peer_gear, \
            start_gateway({"PRIMARY_BASE_URL": peer_gear.url,
                           "PRIMARY_SERVED_NAME": "p"}) as peer, \
            start_sim("instant", served_name="a") as gear:
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": "a",
               "MULTIMODAL_FEASIBLE": "false", "MULTIMODAL_ROUTE": "proxy",
               "MULTIMODAL_PEER_ORIGIN": peer.url, "GATEWAY_PROBE_INTERVAL_S": "0.5"}
        with start_gateway(env) as gateway:
            _open(driver, gateway.url + "/ui")
            ui.wait_for(driver, lambda d: {"role": "senses", "origin": peer.url,
                                           "state": "ready"} in ui.links(d),
                        "the senses link ready")
            peer.stop()
            ui.wait_for(driver, lambda d: ui.boxes(d).get(peer.url) == "unreachable",
                        "the stopped peer drawn unreachable")
            gateway.stop()
            ui.wait_for(driver, lambda d: d.find_element(By.ID, "state")
                        .get_attribute("data-state") == "stale", "the page to say stale")


def test_private_status_asks_for_the_key_once_and_keeps_it_out_of_the_url(driver):
    with start_sim("instant", served_name="s") as gear:
        env = {"PRIMARY_BASE_URL": gear.url, "PRIMARY_SERVED_NAME": "s",
               "GATEWAY_API_KEY": KEY, "GATEWAY_PRIVATE_STATUS": "true"}
        with start_gateway(env) as gateway:
            for path in ("/status", "/capabilities"):
                with pytest.raises(urllib.error.HTTPError) as refused:
                    urllib.request.urlopen(gateway.url + path, timeout=10)
                assert refused.value.code == 401
                assert b"invalid_api_key" in refused.value.read()
            assert gateway.get_json("/status", {"Authorization": f"Bearer {KEY}"})["backends"]
            _open(driver, gateway.url + "/ui")
            form = ui.wait_for(driver, lambda d: d.find_element(By.ID, "key-form").is_displayed()
                               and d.find_element(By.ID, "key-form"), "the page to ask for the key")
            driver.find_element(By.ID, "key").send_keys(KEY)
            form.find_element(By.TAG_NAME, "button").click()
            ui.wait_live(driver)
            assert not driver.find_element(By.ID, "key-form").is_displayed()
            driver.refresh()  # kept for the tab: asked once
            ui.wait_live(driver)
            assert not driver.find_element(By.ID, "key-form").is_displayed()
            assert driver.execute_script("return sessionStorage.length") == 1
            urls = ui.requested_urls(driver)
            assert urls and not [url for url in urls if KEY in url]
            # Only the refused polls before the key was given may be logged as errors.
            errors = [e for e in ui.console_errors(driver) if "401" not in e["message"]]
            assert errors == []
