"""The live page on the deployed mesh, in headless Chromium on the controller: the Orin's /ui
draws the three boxes, and once the Thor is cut off its network, the Thor and its links turn
unreachable within one probe interval, and ready again after it is reconnected."""

from __future__ import annotations

import os
from pathlib import Path

from fleet_mesh import ONE_PROBE_INTERVAL_S, Mesh, partitioned

from tests.support import browser as ui

# The page polls every 3 s: a state the gateway has is drawn within one poll of it.
PAGE_POLL_S = 3.0
SCREENSHOTS = os.environ.get("LOBES_UI_SCREENSHOTS")


def _thor_links(driver, thor_origin: str) -> set[str]:
    return {link["state"] for link in ui.links(driver) if link["origin"] == thor_origin}


def test_the_orin_page_shows_three_boxes_and_the_thor_cut_off_and_back(mesh: Mesh) -> None:
    orin, spark, thor = mesh["agx-orin"], mesh["spark"], mesh["agx-thor"]
    within = ONE_PROBE_INTERVAL_S + PAGE_POLL_S + 2.0
    with ui.browser(height=1900) as driver:
        driver.get(orin.origin + "/ui")
        ui.wait_live(driver, timeout=30)
        drawn = ui.wait_for(driver, lambda d: (boxes := ui.boxes(d)) and all(
            boxes.get(peer.origin) == "ready" for peer in (spark, thor)) and boxes,
            "the Spark and the Thor drawn ready beside the Orin", timeout=30)
        assert len(drawn) == 3, drawn
        assert _thor_links(driver, thor.origin) == {"ready"}
        assert ui.console_errors(driver) == []
        assert ui.foreign(ui.requested_urls(driver), orin.origin) == []
        with partitioned(thor):
            ui.wait_for(driver, lambda d: ui.boxes(d).get(thor.origin) == "unreachable"
                        and _thor_links(d, thor.origin) == {"unreachable"},
                        "the Thor and its links drawn unreachable", timeout=within)
            assert ui.boxes(driver)[spark.origin] == "ready"
            if SCREENSHOTS:
                driver.save_screenshot(str(Path(SCREENSHOTS) / "live-page-mesh-thor-cut.png"))
        ui.wait_for(driver, lambda d: ui.boxes(d).get(thor.origin) == "ready"
                    and _thor_links(d, thor.origin) == {"ready"},
                    "the Thor and its links ready again", timeout=within + 10)
        assert ui.console_errors(driver) == []
