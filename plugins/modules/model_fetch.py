#!/usr/bin/python
# Copyright: lobes.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Ansible module lobes.fleet.model_fetch: fetch one checkpoint revision from the hub, checked."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: model_fetch
short_description: Fetch every file of one revision of a hub checkpoint, checked, onto the box
version_added: 0.1.0
description:
  - Resolves O(revision) of O(checkpoint) on the hub (a branch to its commit), then makes
    C(<model_dir>/<org>/<name>/<commit>) hold every file of that commit, each checked against
    the hub's published hash (an LFS file's sha256, another file's git blob id).
  - Files are fetched into C(<model_dir>/.partial/<org>/<name>/<commit>), resumed with a
    Range request where a earlier run or a cut connection left them partial; a file that
    fails its check is fetched again once. The staging directory is renamed into place only
    when every file is whole and checked, so the final name never holds half a model.
  - A final directory already whole is left alone and no byte is fetched; its
    C(.lobes-manifest.json) (each file's size, sha256 and mtime) spares re-hashing files
    whose size and mtime did not change.
  - While bytes arrive, C(<model_dir>/.progress/<org>__<name>@<commit>.json) says the bytes
    done and in all, the rate and when the fetch last moved (M(lobes.fleet.model_progress)
    reads it); it is removed once the revision is whole.
  - File names from the hub are refused when absolute, holding C(..), a backslash or a
    control character.
author:
  - lobes.fleet maintainers (@lobes-fleet)
extends_documentation_fragment:
  - lobes.fleet.attributes
  - lobes.fleet.attributes.changes
  - lobes.fleet.attributes.posix
  - lobes.fleet.model
  - lobes.fleet.model.checkpoint
options:
  revision:
    description: A 40-hex commit, or a branch resolved to its commit now.
    type: str
    default: main
  endpoint:
    description: The hub's origin.
    type: str
    default: https://huggingface.co
  token:
    description:
      - A hub access token, for gated or private checkpoints. Sent only to O(endpoint)'s
        origin, never to the host a download is redirected to.
    type: str
  timeout:
    description: Seconds a request may wait for the hub's next bytes.
    type: int
    default: 60
"""

EXAMPLES = r"""
- name: Fetch the pinned revision of the chat checkpoint once
  lobes.fleet.model_fetch:
    checkpoint: Qwen/Qwen3.5-4B
    revision: "{{ lock.checkpoints['Qwen/Qwen3.5-4B'].revision }}"
    token: "{{ fleet_hub_token | default(omit) }}"
    model_dir: /var/lib/lobes/models
"""

RETURN = r"""
checkpoint:
  description: The checkpoint fetched (as given), so a loop's results name what each says.
  returned: always
  type: str
revision:
  description: The commit the revision resolved to.
  returned: always
  type: str
  sample: 0123456789abcdef0123456789abcdef01234567
path:
  description: The final directory of the revision.
  returned: always
  type: str
  sample: /var/lib/lobes/models/Qwen/Qwen3.5-4B/0123456789abcdef0123456789abcdef01234567
files:
  description: Every file of the revision with its size and sha256 (the hub's, in check mode).
  returned: always
  type: dict
  sample:
    config.json:
      size: 1234
      sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
bytes_fetched:
  description: Bytes received from the hub by this run (in check mode, the bytes a run would fetch).
  returned: always
  type: int
  sample: 8053063680
bytes_total:
  description: The size of the whole revision.
  returned: always
  type: int
  sample: 8053063680
seconds:
  description: Wall time of the run.
  returned: always
  type: float
  sample: 95.2
rate:
  description: Bytes fetched per second.
  returned: always
  type: float
  sample: 84768540.3
"""

import json  # noqa: E402 - modules keep imports below their documentation
import os  # noqa: E402
import re  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from http.client import HTTPException  # noqa: E402
from urllib.parse import quote, urljoin, urlsplit  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (  # noqa: E402
    CHECKPOINT_OPTION,
    CHUNK,
    COMMIT,
    MODEL_DIR_OPTION,
    UnsafePath,
    cached_sha256,
    check_checkpoint,
    digest,
    final_dir,
    inside,
    manifest_entry,
    promote,
    read_manifest,
    safe_relpath,
    staging_dir,
    write_manifest,
)
from ansible_collections.lobes.fleet.plugins.module_utils.model_progress import Progress  # noqa: E402

_BRANCH = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]*\Z")
_SHA256 = re.compile(r"^[0-9a-f]{64}\Z")
_ATTEMPTS = 3  # connections per file before a cut download fails the run
_REDIRECTS = 5


class FetchError(Exception):
    """A failure whose message is shown as is (it never holds the token)."""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects come back as HTTPError: _open follows them itself, to decide the headers."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


class Hub:
    """The hub's download API through urllib; the token goes to the hub's own origin only."""

    def __init__(self, endpoint, token, timeout):
        self.endpoint = endpoint.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._opener = urllib.request.build_opener(_NoRedirect)

    def _origin(self, url):
        parts = urlsplit(url)
        return (parts.scheme, parts.hostname, parts.port)

    def open(self, url, headers=None):
        """GET url, following redirects; Authorization only where the origin is the hub's."""
        for _hop in range(_REDIRECTS):
            request = urllib.request.Request(url, headers=dict(headers or {}))
            if self.token and self._origin(url) == self._origin(self.endpoint):
                request.add_unredirected_header("Authorization", f"Bearer {self.token}")
            try:
                return self._opener.open(request, timeout=self.timeout)
            except urllib.error.HTTPError as error:
                location = error.headers.get("Location")
                if error.code not in (301, 302, 303, 307, 308) or not location:
                    raise
                error.close()
                url = urljoin(url, location)
        raise FetchError(f"more than {_REDIRECTS} redirects from {self.endpoint}")

    def redact(self, text):
        return text.replace(self.token, "********") if self.token else text


# The hub's X-Error-Code names the cause; the status alone misleads (an unknown repo answers
# 401 without a token, since the hub does not tell it from a private one).
_FIXES = {
    "RepoNotFound": "check the repo id; a private repo also needs a token of an account that can "
                    "read it (module option token)",
    "RevisionNotFound": "check that the revision is a branch or a commit of the repo",
    "EntryNotFound": "the file is listed but not served: fetch the revision again",
    "GatedRepo": "the checkpoint is gated: accept its terms on the hub with an account and give "
                 "that account's token (module option token)",
}
_STATUS_FIXES = {
    401: "the checkpoint is gated or private: give the token of an account that can read it "
         "(module option token)",
    403: "the token given has no access to it: accept its terms on the hub with that token's "
         "account",
    404: "check the repo id and that the revision is a branch or a commit of it",
}


def _hub_error(hub, error, checkpoint, revision, what):
    """A message naming the checkpoint, the revision and the fix; the hub's words, token masked."""
    said = hub.redact(error.headers.get("X-Error-Message") or "")
    said = f" (the hub says: {said[:200]})" if said else ""
    fix = _FIXES.get(error.headers.get("X-Error-Code") or "") or _STATUS_FIXES.get(error.code)
    fix = f": {fix}" if fix else ""
    return (f"{what} {checkpoint} at revision {revision}: HTTP {error.code} from "
            f"{hub.endpoint}{fix}{said}")


def _expected(sibling):
    """(path, size, kind, hash) of a sibling: kind sha256 for an LFS file, blob for another."""
    path = safe_relpath(sibling.get("rfilename"))
    size = sibling.get("size")
    lfs = sibling.get("lfs")
    if isinstance(lfs, dict):
        sha256 = lfs.get("sha256")
        if not isinstance(sha256, str) or not _SHA256.match(sha256):
            raise FetchError(f"the hub lists {path!r} with an LFS sha256 that is not 64 hex")
        size = lfs.get("size", size)
        kind, want = "sha256", sha256
    else:
        want = sibling.get("blobId")
        if not isinstance(want, str) or not COMMIT.match(want):
            raise FetchError(f"the hub lists {path!r} without a blobId (was ?blobs=true honoured?)")
        kind = "blob"
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise FetchError(f"the hub lists {path!r} without a size")
    return path, size, kind, want


def resolve(hub, checkpoint, revision):
    """(commit, {path: (size, kind, hash)}) of a revision, from the hub's revision endpoint."""
    url = (f"{hub.endpoint}/api/models/{checkpoint}/revision/"
           f"{quote(revision, safe='')}?blobs=true")
    try:
        with hub.open(url) as answer:
            info = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise FetchError(_hub_error(hub, error, checkpoint, revision, "resolving")) from None
    except (OSError, HTTPException, ValueError) as error:
        raise FetchError(f"resolving {checkpoint} at revision {revision} on {hub.endpoint}: "
                         f"{hub.redact(str(error))}") from None
    commit = info.get("sha") if isinstance(info, dict) else None
    if not isinstance(commit, str) or not COMMIT.match(commit):
        raise FetchError(f"the hub answered no commit for {checkpoint} at revision {revision}")
    if COMMIT.match(revision) and commit != revision:
        raise FetchError(f"the hub answered commit {commit} for {checkpoint} at {revision}")
    expected = {}
    for sibling in info.get("siblings") or []:
        if not isinstance(sibling, dict):
            raise FetchError(f"the hub lists a file of {checkpoint} that is not an object")
        try:
            path, size, kind, want = _expected(sibling)
        except UnsafePath as error:
            raise FetchError(f"refusing {checkpoint} at {commit}: {error}") from None
        expected[path] = (size, kind, want)
    return commit, expected


class Fetcher:
    """Fetches the files of one commit into its staging directory, resuming and checking them."""

    def __init__(self, hub, checkpoint, commit, staging, progress):
        self.hub = hub
        self.progress = progress
        self.checkpoint = checkpoint
        self.commit = commit
        self.staging = staging
        self.bytes_fetched = 0

    def _url(self, path):
        return f"{self.hub.endpoint}/{self.checkpoint}/resolve/{self.commit}/{quote(path)}"

    def _download(self, path, target, size):
        """Bring target up to size bytes, resuming from what it holds."""
        have = os.path.getsize(target) if os.path.isfile(target) else 0
        if have > size:
            os.unlink(target)
            self.progress.add(-size)  # counted up to its size: copied again from its start
            have = 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            answer = self.hub.open(self._url(path), headers)
        except urllib.error.HTTPError as error:
            if error.code == 416 and have == size:
                return
            raise FetchError(_hub_error(self.hub, error, self.checkpoint, self.commit,
                                        f"fetching {path} of")) from None
        resumed = answer.status == 206
        if resumed and not (answer.headers.get("Content-Range") or "").startswith(f"bytes {have}-"):
            answer.close()
            raise HTTPException(f"asked for bytes from {have}, the server answered "
                                f"{answer.headers.get('Content-Range')!r}")
        with answer, open(target, "ab" if resumed else "wb") as out:
            # read1: what has arrived, so a run killed midway keeps it for the next to resume.
            while True:
                chunk = answer.read1(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                out.flush()
                self.bytes_fetched += len(chunk)
                self.progress.add(len(chunk))

    def fetch(self, path, size):
        """Download one file whole, over a few connections when one is cut."""
        target = inside(self.staging, path)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        for _attempt in range(_ATTEMPTS):
            try:
                self._download(path, target, size)
            except (OSError, HTTPException) as error:
                last = self.hub.redact(str(error))
            else:
                if os.path.isfile(target) and os.path.getsize(target) >= size:
                    break
                last = "the connection closed early"
        else:
            raise FetchError(f"fetching {path} of {self.checkpoint} at {self.commit}: {last} "
                             f"after {_ATTEMPTS} connections")
        return target

    def checked(self, path, size, kind, want):
        """Fetch (or keep) path in staging and check it; fetched again once if it fails."""
        for _attempt in range(2):
            target = self.fetch(path, size)
            found = digest(target)
            got = found.sha256 if kind == "sha256" else found.blob_sha1
            if found.size == size and got == want:
                return manifest_entry(target, found.sha256)
            os.unlink(target)
            self.progress.add(-min(found.size, size))  # fetched again from its start
        raise FetchError(f"{path} of {self.checkpoint} at {self.commit} fails its check twice: "
                         f"expected {kind} {want} ({size} bytes), found {got} ({found.size} bytes)")


def _final_state(final, expected):
    """Whether the final directory holds every file checked, and its manifest entries.

    A file whose size and mtime the manifest recorded is not hashed again: the manifest is
    written only for files checked against this commit's hashes.
    """
    if not os.path.isdir(final):
        return False, {}
    manifest = read_manifest(final)
    entries = {}
    for path, (size, kind, want) in expected.items():
        target = inside(final, path)
        if not os.path.isfile(target) or os.path.getsize(target) != size:
            return False, {}
        cached = cached_sha256(target, manifest.get(path))
        if cached and (kind == "blob" or cached == want):
            entries[path] = manifest_entry(target, cached)
            continue
        found = digest(target)
        if (found.sha256 if kind == "sha256" else found.blob_sha1) != want:
            return False, {}
        entries[path] = manifest_entry(target, found.sha256)
    return True, entries


def _present_revisions(checkpoint_dir):
    """The commits a checkpoint already has a final directory for."""
    try:
        return {name for name in os.listdir(checkpoint_dir) if COMMIT.match(name)}
    except OSError:
        return set()


def _staged_bytes(staging, expected):
    total = 0
    for path, (size, _kind, _want) in expected.items():
        target = os.path.join(staging, path)
        if os.path.isfile(target):
            total += min(os.path.getsize(target), size)
    return total


def _result(commit, final, files, fetched, total, started):
    seconds = round(time.monotonic() - started, 3)
    return dict(revision=commit, path=final, files=files, bytes_fetched=fetched,
                bytes_total=total, seconds=seconds,
                rate=round(fetched / seconds, 1) if seconds > 0 else 0.0)


def run(module, hub):
    """The module's work; raises FetchError for a failure to report."""
    params = module.params
    started = time.monotonic()
    checkpoint, revision = params["checkpoint"], params["revision"]
    try:
        check_checkpoint(checkpoint)
    except ValueError as error:
        raise FetchError(str(error)) from None
    if not _BRANCH.match(revision) or ".." in revision:
        raise FetchError(f"revision {revision!r} of {checkpoint} is not a branch or a commit")
    commit, expected = resolve(hub, checkpoint, revision)
    final = final_dir(params["model_dir"], checkpoint, commit)
    staging = staging_dir(params["model_dir"], checkpoint, commit)
    total = sum(size for size, _kind, _want in expected.values())
    whole, entries = _final_state(final, expected)
    others = _present_revisions(os.path.dirname(final)) - {commit}
    before = sorted(others | ({commit} if whole else set()))
    diff = dict(before="".join(f"revision: {rev}\n" for rev in before) or "revision: (none)\n",
                after="".join(f"revision: {rev}\n" for rev in sorted(others | {commit})))
    if whole:
        if entries != read_manifest(final) and not module.check_mode:
            write_manifest(final, entries)  # files re-hashed: spare it next time
        files = {p: {"size": e["size"], "sha256": e["sha256"]} for p, e in entries.items()}
        return dict(changed=False, **_result(commit, final, files, 0, total, started))
    if module.check_mode:
        files = {p: {"size": s, "sha256": w if k == "sha256" else None}
                 for p, (s, k, w) in expected.items()}
        need = total - _staged_bytes(staging, expected)
        return dict(changed=True, diff=diff, **_result(commit, final, files, need, total, started))
    if os.path.isdir(final) and not os.path.exists(staging):
        # Not whole: its good files are kept by checking them again in staging.
        os.makedirs(os.path.dirname(staging), mode=0o755, exist_ok=True)
        os.rename(final, staging)
    os.makedirs(staging, mode=0o755, exist_ok=True)
    progress = Progress(params["model_dir"], checkpoint, commit, total=total,
                        done=_staged_bytes(staging, expected), source=hub.endpoint)
    fetcher = Fetcher(hub, checkpoint, commit, staging, progress)
    manifest = {path: fetcher.checked(path, *expected[path]) for path in sorted(expected)}
    promote(staging, final, manifest)
    progress.done()
    files = {p: {"size": e["size"], "sha256": e["sha256"]} for p, e in manifest.items()}
    return dict(changed=True, diff=diff,
                **_result(commit, final, files, fetcher.bytes_fetched, total, started))


def main():
    module = AnsibleModule(
        argument_spec=dict(
            **CHECKPOINT_OPTION,
            **MODEL_DIR_OPTION,
            revision=dict(type="str", default="main"),
            endpoint=dict(type="str", default="https://huggingface.co"),
            token=dict(type="str", no_log=True),
            timeout=dict(type="int", default=60),
        ),
        supports_check_mode=True,
    )
    hub = Hub(module.params["endpoint"], module.params["token"], module.params["timeout"])
    try:
        result = run(module, hub)
    except FetchError as error:
        module.fail_json(msg=hub.redact(str(error)))
    result["checkpoint"] = module.params["checkpoint"]
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
