"""The live page of the embedded default: site.yml against a copy of inventories/local (on the
test's own ports and state directory), then /ui in headless Chromium shows every role of the
plan ready, with no console error and no request off the gateway's origin."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from tests.integration.conftest import supervisor
from tests.integration.test_playbooks import LocalMesh
from tests.support import browser as ui

SCREENSHOTS = os.environ.get("LOBES_UI_SCREENSHOTS")
# The traffic sent before a screenshot: one answer every 1.5 s for half a minute.
TRAFFIC_REQUESTS, TRAFFIC_EVERY_S = 20, 1.5


@pytest.fixture(scope="module")
def local_default(tmp_path_factory):
    deployed = LocalMesh(tmp_path_factory.mktemp("local-default"))
    try:
        done = deployed.playbook("site.yml")
        assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
        yield deployed
    finally:
        supervisor(deployed.deploy_dir / "state", "down")


@pytest.mark.slow
def test_the_local_default_shows_every_role_of_its_plan_ready(local_default):
    planned = yaml.safe_load(local_default.host_vars.read_text())["fleet_roles"]
    url = f"http://127.0.0.1:{local_default.port}"
    with ui.browser(height=1700) as driver:  # the whole page in one screenshot
        driver.get(url + "/ui")
        ui.wait_live(driver, timeout=60)

        def every_role_ready(d):
            roles = ui.rows(d, "roles", "data-role")
            return roles if all(roles.get(name, {}).get("ready") == "true"
                                for name in planned) else None
        roles = ui.wait_for(driver, every_role_ready, f"every planned role ({sorted(planned)}) "
                            "shown ready", timeout=60)
        assert set(planned) <= set(roles)
        gears = ui.rows(driver, "gears", "data-gear")
        assert {name for name, row in gears.items() if row["ready"] == "true"} >= set(planned)
        assert ui.console_errors(driver) == []
        assert ui.foreign(ui.requested_urls(driver), url) == []
        if SCREENSHOTS:  # a few answers first, so the picture has rates and a chart to show
            for _request in range(TRAFFIC_REQUESTS):
                local_default.chat("main")
                time.sleep(TRAFFIC_EVERY_S)
            ui.wait_for(driver, lambda d: len(ui.rows(d, "ttft", "data-role")) > 0,
                        "the TTFT of the answers shown")
            time.sleep(TRAFFIC_EVERY_S)
            driver.save_screenshot(str(Path(SCREENSHOTS) / "live-page-local.png"))
