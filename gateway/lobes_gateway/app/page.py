"""The live page: GET /ui and its two assets, read from the package once and served as bytes.

The page is static (ui/ui.html, ui.css, ui.js ship inside the package, no build step) and
reads everything it shows from /status and /capabilities on the same origin; the gateway does
nothing for it between requests. A strict Content-Security-Policy allows only this origin's
script, style and fetches, so markup in a value shown (a served name, a peer origin) can never
run, and the page works on a network with no way out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

UI_PATH = "/ui"
_ASSETS = Path(__file__).resolve().parent / "ui"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
       "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = (("Content-Security-Policy", CSP), ("X-Content-Type-Options", "nosniff"),
            ("Referrer-Policy", "no-referrer"), ("Cache-Control", "no-cache"))
# Path -> (file under ui/, content type).
_FILES = {UI_PATH: ("ui.html", "text/html; charset=utf-8"),
          f"{UI_PATH}/ui.css": ("ui.css", "text/css; charset=utf-8"),
          f"{UI_PATH}/ui.js": ("ui.js", "text/javascript; charset=utf-8")}
PAGE_PATHS = tuple(_FILES)


@dataclass(frozen=True)
class Asset:
    """One file of the page, ready to write."""

    body: bytes
    content_type: str
    headers: tuple[tuple[str, str], ...] = _HEADERS


def load_assets(root: Path = _ASSETS) -> dict[str, Asset]:
    """Every path of the page and its bytes, read once at start-up."""
    return {path: Asset((root / name).read_bytes(), content_type)
            for path, (name, content_type) in _FILES.items()}
