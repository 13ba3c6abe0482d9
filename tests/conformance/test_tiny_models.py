"""The tiny models are built offline and byte for byte the same every time: two builds in a row
(and the cached build the suite serves) hold the same files with the same bytes."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.support.vllm_proc import ROOT, EngineInstall

pytestmark = pytest.mark.engine

BUILDER = ROOT / "gateway" / "lobes_engine" / "tiny_models.py"


def digests(directory: Path) -> dict[str, str]:
    return {str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(directory.rglob("*")) if path.is_file()}


def build(install: EngineInstall, out: Path) -> dict:
    done = subprocess.run([str(install.python), str(BUILDER), str(out)], capture_output=True,
                          text=True, timeout=300, check=False,
                          env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_two_builds_give_the_same_bytes(install: EngineInstall, tmp_path: Path):
    first, second = build(install, tmp_path / "one"), build(install, tmp_path / "two")
    assert set(first) == set(second) == {"tiny-chat", "tiny-embed"}
    for name in first:
        files = digests(Path(first[name]))
        assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files)
        assert files == digests(Path(second[name])), name
        assert files == digests(install.model_dir / "lobes" / name), name


def test_the_chat_model_reads_tool_calls_and_ends_on_im_end(install: EngineInstall):
    chat = install.model_dir / "lobes" / "tiny-chat"
    config = json.loads((chat / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] // config["num_attention_heads"] == 64
    vocabulary = json.loads((chat / "tokenizer.json").read_text())
    added = {token["content"]: token for token in vocabulary["added_tokens"]}
    # The hermes parser looks the call markers up in the vocabulary and reads them from the
    # decoded text: plain added tokens, never special (special ones are skipped on decoding).
    for marker in ("<tool_call>", "</tool_call>"):
        assert added[marker]["special"] is False
    assert added["<|im_end|>"]["special"] is True
    assert config["eos_token_id"] == added["<|im_end|>"]["id"]
