"""A checkpoint for the models scenario, made on the controller as the hub would serve one: a
few files of pseudo-random bytes (the same on every run), their sizes and sha256, and a
revision derived from them as a commit id is from its tree. Prints {"revision", "files",
"made"} as JSON; files already there are hashed, not written again.

    python3 make_checkpoint.py DIR
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
from pathlib import Path

MIB = 1024 * 1024
# Two shards large enough that a copy over a rate-limited link takes seconds (a partition can
# land in the middle of one), and the small files a checkpoint has beside them.
FILES = {
    "config.json": 0,
    "tokenizer.json": 1 * MIB,
    "model-00001-of-00002.safetensors": 64 * MIB,
    "model-00002-of-00002.safetensors": 64 * MIB,
}
CONFIG = b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}\n'


def content(name: str, size: int) -> bytes:
    if not size:
        return CONFIG
    return random.Random(name).randbytes(size)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(MIB):
            digest.update(block)
    return digest.hexdigest()


def main(directory: Path) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    made = False
    files = {}
    for name, size in FILES.items():
        path = directory / name
        if not path.exists():
            path.write_bytes(content(name, size))
            made = True
        files[name] = {"size": path.stat().st_size, "sha256": sha256_of(path)}
    tree = "".join(f"{name}\0{entry['size']}\0{entry['sha256']}\n"
                   for name, entry in sorted(files.items()))
    revision = hashlib.sha1(tree.encode()).hexdigest()
    return {"revision": revision, "files": files, "made": made}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
