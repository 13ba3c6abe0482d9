"""A forced tool call (`tool_choice` "required" or a named function) as vLLM's hermes parser
and its grammar return it: the model writes `<tool_call>\\n{"name": ..., "arguments": ...}
\\n</tool_call>` token by token; a finished call comes back parsed into `tool_calls` with
finish_reason "tool_calls" ("stop" for a named function, as vLLM ends it), a call cut by
max_tokens as its raw text in `content` with
"length". Streamed, the call's id and name go out once the name is written, then its
arguments fragment by fragment. `auto` and `none` answer text, as a model that chooses not
to call does.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from . import errors

_SAMPLE_VALUES: dict[str, Any] = {"string": "sim", "integer": 0, "number": 0, "boolean": False,
                                  "array": [], "object": {}}


@dataclass(frozen=True)
class ForcedCall:
    """The call a forced tool choice makes, and its text cut into output tokens."""

    name: str
    arguments: str  # JSON text
    chars_per_token: int
    call_id: str
    # A named function's call ends as vLLM's structured output does, "stop"; a required one
    # as the tool parser's, "tool_calls".
    named: bool = False

    @property
    def head(self) -> str:
        """The call's text up to its arguments: once written, the parser knows the name."""
        return f'<tool_call>\n{{"name": "{self.name}", "arguments": '

    @property
    def text(self) -> str:
        return f"{self.head}{self.arguments}}}\n</tool_call>"

    @property
    def length(self) -> int:
        """Output tokens of the whole call (its natural length)."""
        return -(-len(self.text) // self.chars_per_token)

    def written(self, tokens: int) -> str:
        """The call's text after `tokens` output tokens."""
        return self.text[:tokens * self.chars_per_token]

    def arguments_written(self, tokens: int) -> str | None:
        """The arguments' text written after `tokens` tokens; None before the name is whole."""
        text = self.written(tokens)
        if len(text) < len(self.head):
            return None
        return text[len(self.head):len(self.head) + len(self.arguments)]

    def tool_calls(self) -> list[dict[str, Any]]:
        """The parsed call of a finished answer."""
        return [{"id": self.call_id, "type": "function",
                 "function": {"name": self.name, "arguments": self.arguments}}]


def forced_call(body: dict[str, Any], seed: int, chars_per_token: int) -> ForcedCall | None:
    """The call a request forces (tool_choice "required" or a named function), else None."""
    tools = [tool for tool in body.get("tools") or [] if isinstance(tool, dict)]
    choice = body.get("tool_choice")
    if choice == "required":
        if not tools:
            raise errors.bad_request("When using `tool_choice`, `tools` must be set.",
                                     "tool_choice")
        function = (tools[seed % len(tools)].get("function") or {})
    elif isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        matching = [tool.get("function") or {} for tool in tools
                    if (tool.get("function") or {}).get("name") == name]
        if not matching:
            raise errors.bad_request(f"Tool '{name}' has not been passed in `tools`.",
                                     "tool_choice")
        function = matching[0]
    else:
        return None
    arguments = _sample_arguments(function.get("parameters") or {}, seed)
    return ForcedCall(name=str(function.get("name")), arguments=json.dumps(arguments),
                      chars_per_token=chars_per_token,
                      call_id=f"chatcmpl-tool-{uuid.uuid4().hex[:16]}",
                      named=isinstance(choice, dict))


def _sample_arguments(schema: dict[str, Any], seed: int) -> dict[str, Any]:
    """Arguments that hold to the schema: each required property, an enum's value picked by
    the seed, else a plain value of its type."""
    properties = schema.get("properties") or {}
    arguments = {}
    for name in schema.get("required") or list(properties):
        spec = properties.get(name) or {}
        if spec.get("enum"):
            arguments[name] = spec["enum"][seed % len(spec["enum"])]
        else:
            arguments[name] = _SAMPLE_VALUES.get(spec.get("type"))
    return arguments
