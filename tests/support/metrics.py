"""Read a gateway's /metrics with a real parser, and check it with promtool where installed.

    scrape = Scrape.of(gateway.url)
    scrape.value("lobes_gateway_requests_total", role="cortex", code="200")   # summed
    scrape.series("lobes_gateway_requests_total")                            # label sets
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from tests.support.client import call
from tests.support.tools import not_installed

PROMTOOL = shutil.which("promtool")
PROMTOOL_MISSING = not_installed("promtool", "prometheus")


@dataclass
class Scrape:
    """One scrape: the raw text and every sample as (name, labels, value)."""

    text: str
    samples: list[tuple[str, dict[str, str], float]]
    content_type: str

    @classmethod
    def of(cls, url: str) -> Scrape:
        reply = call(url, "GET", "/metrics")
        assert reply.status == 200, reply.body
        return cls.from_text(reply.body.decode(), reply.headers["content-type"])

    @classmethod
    def from_text(cls, text: str, content_type: str) -> Scrape:
        """One scrape's exposition text, parsed (a gear's /metrics as its gateway relays it)."""
        samples = [(s.name, dict(s.labels), s.value)
                   for family in text_string_to_metric_families(text) for s in family.samples]
        return cls(text, samples, content_type)

    def value(self, name: str, **labels: str) -> float:
        """The sum of `name`'s samples whose labels include `labels` (0 when none)."""
        return sum(value for sample, have, value in self.samples
                   if sample == name and labels.items() <= have.items())

    def series(self, prefix: str = "lobes_gateway_") -> set[tuple[str, frozenset]]:
        """Every series (name and label set) whose name starts with `prefix`."""
        return {(name, frozenset(labels.items())) for name, labels, _ in self.samples
                if name.startswith(prefix)}

    def promtool_problems(self) -> str:
        """What `promtool check metrics` says of the text ("" when it passes)."""
        assert PROMTOOL is not None
        done = subprocess.run([PROMTOOL, "check", "metrics"], input=self.text, text=True,
                              capture_output=True, timeout=30, check=False)
        return "" if done.returncode == 0 else done.stdout + done.stderr
