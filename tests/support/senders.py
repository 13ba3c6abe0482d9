"""Requests sent from threads at once, their replies collected by marker once joined."""

from __future__ import annotations

import threading
from collections.abc import Callable

from .client import Reply

# ask(url, marker, key name, max_tokens, **headers): one request, tagged by its marker.
Ask = Callable[..., Reply]


class Sender:
    """Requests sent from threads; their replies by marker once joined."""

    def __init__(self, url: str, ask: Ask) -> None:
        self.url = url
        self._ask = ask
        self.threads: list[threading.Thread] = []
        self.replies: dict[str, Reply] = {}

    def send(self, marker: str, name: str, tokens: int = 8, **headers: str) -> None:
        def run() -> None:
            self.replies[marker] = self._ask(self.url, marker, name, tokens, **headers)

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)

    def join(self) -> dict[str, Reply]:
        for thread in self.threads:
            thread.join(timeout=60)
        return self.replies
