"""Run a collection module in-process the way Ansible does, and read its result."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stdout

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(main, args: dict, *, check_mode: bool = False, diff: bool = False) -> dict:
    """Call main() with args; return the JSON result it printed."""
    full = {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}
    out = io.StringIO()
    with patch_module_args(full), redirect_stdout(out), pytest.raises(SystemExit):
        main()
    return json.loads(out.getvalue())
