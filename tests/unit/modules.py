"""Run a collection module in-process the way Ansible does, and read its result."""

from __future__ import annotations

import json

import pytest
from ansible.module_utils.testing import patch_module_args


def run_module(main, capsys, args: dict, *, check_mode: bool = False, diff: bool = False):
    """Call main() with args; return the JSON result it printed."""
    full = {**args, "_ansible_check_mode": check_mode, "_ansible_diff": diff}
    with patch_module_args(full), pytest.raises(SystemExit):
        main()
    return json.loads(capsys.readouterr().out)
