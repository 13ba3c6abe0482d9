"""A checkpoint's files read from another box over SSH: one ssh command per request to the
source box's read-only file server (gateway/lobes_model_serve.py, its copy key's forced
command), its output streamed to a file as it arrives so a cut copy keeps what came.
Used by lobes.fleet.model_pull (checkpoint files) and lobes.fleet.image_pull (exported images)."""

from __future__ import annotations

import os
import select
import subprocess
import tempfile

from ansible_collections.lobes.fleet.plugins.module_utils.model_files import (
    CHUNK,
    COPY_KEY,
    digest,
    inside,
    manifest_entry,
)

# The SSH options of a copy from a source box (Source reads them); documented once in the doc
# fragment lobes.fleet.model.copy.
COPY_SOURCE_OPTIONS = {
    "ssh_user": {"type": "str", "default": "root"},
    "ssh_key": {"type": "path"},
    "ssh_port": {"type": "int", "default": 22},
    "timeout": {"type": "int", "default": 30},
}


class PullError(Exception):
    """A failure reported as is."""


def ssh_argv(key, port, user, host, known_hosts, timeout):
    """The ssh command line one request to a source box runs with (the command follows):
    no config file, no agent or X forwarding, the copy key alone, a new host key accepted into
    known_hosts and a changed one refused, a dead connection given up after `timeout`."""
    return [
        "ssh", "-F", "none", "-T", "-x", "-a", "-i", key, "-p", str(port),
        "-o", "BatchMode=yes",
        "-o", "IdentitiesOnly=yes",
        "-o", "LogLevel=ERROR",
        "-o", "StrictHostKeyChecking=accept-new",
        "-o", f"UserKnownHostsFile={known_hosts}",
        "-o", f"ConnectTimeout={timeout}",
        "-o", f"ServerAliveInterval={max(1, timeout // 3)}",
        "-o", "ServerAliveCountMax=3",
        "-l", user, "--", host,
    ]


class Source:
    """The source box's file server, one ssh command per request."""

    def __init__(self, params):
        self.timeout = params["timeout"]
        self.where = f"{params['ssh_user']}@{params['source']}"
        self.argv = ssh_argv(
            params["ssh_key"] or os.path.join(params["model_dir"], COPY_KEY),
            params["ssh_port"], params["ssh_user"], params["source"],
            os.path.join(params["model_dir"], ".ssh", "known_hosts"), self.timeout)

    def read(self, command, out, progress=None):
        """Append what `command` sends to the file object out; the bytes received. progress,
        when given, is called with the size of each chunk as it lands."""
        with tempfile.TemporaryFile() as errors:
            # stderr to a file: a pipe left unread could fill and stall ssh.
            proc = subprocess.Popen(
                [*self.argv, command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
            try:
                received = self._stream(proc.stdout, out, progress)
            except BaseException:
                proc.kill()  # stalled, or the run is stopped: what arrived stays in out
                raise
            finally:
                proc.stdout.close()
                code = self._reap(proc)
            errors.seek(0)
            said = errors.read().decode("utf-8", "replace").strip().splitlines()
        if code != 0:
            reason = said[-1] if said else f"ssh exited {code}"
            raise PullError(f"ssh {self.where} {command!r}: {reason}")
        return received

    def _stream(self, pipe, out, progress):
        """Copy pipe to out until it ends, flushing each chunk; fails when it stalls."""
        received = 0
        while True:
            ready, _w, _x = select.select([pipe], [], [], self.timeout)
            if not ready:
                raise PullError(f"{self.where} sent nothing for {self.timeout}s")
            chunk = os.read(pipe.fileno(), CHUNK)
            if not chunk:
                return received
            out.write(chunk)
            out.flush()  # what arrived is kept if the run is cut
            received += len(chunk)
            if progress:
                progress(len(chunk))

    def _reap(self, proc):
        """ssh's exit status, once it ends (killed when it does not within the timeout)."""
        try:
            return proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


class Puller:
    """Copies files into a staging directory from a Source, resuming and checking each.

    `label` names what the files belong to in messages ("of org/name at <revision>");
    `request(path, offset)` is the server command that sends path from offset to its end;
    `progress(count)`, when given, counts bytes arrived (negative: thrown away to copy again).
    """

    def __init__(self, source, label, staging, request, progress=None):
        self.source = source
        self.label = label
        self.staging = staging
        self.request = request
        self.progress = progress
        self.bytes_copied = 0
        self.pulled = []
        self.resumed = []

    def _copy(self, path, target, size):
        """Bring target up to size bytes from what it holds; fails naming a short copy."""
        have = os.path.getsize(target) if os.path.isfile(target) else 0
        if have > size:
            os.truncate(target, 0)
            have = 0
        if have == size:
            return
        if have and path not in self.resumed:
            self.resumed.append(path)
        with open(target, "ab") as out:
            try:
                self.bytes_copied += self.source.read(self.request(path, have), out,
                                                      self.progress)
            finally:
                if path not in self.pulled:
                    self.pulled.append(path)
        got = os.path.getsize(target)
        if got != size:
            raise PullError(
                f"{path} {self.label}: {self.source.where} "
                f"sent {got} of {size} bytes; the next run resumes from {min(got, size)}"
            )

    def checked(self, path, want):
        """Copy (or keep) path in staging and check it; copied again from 0 once if it fails."""
        target = inside(self.staging, path)
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        for _attempt in range(2):
            self._copy(path, target, want["size"])
            found = digest(target)
            if found.size == want["size"] and found.sha256 == want["sha256"]:
                return manifest_entry(target, found.sha256)
            os.truncate(target, 0)
            if self.progress:
                self.progress(-found.size)  # copied again from its start
        raise PullError(
            f"{path} {self.label} from {self.source.where} "
            f"fails its check twice: expected sha256 {want['sha256']} ({want['size']} "
            f"bytes), found {found.sha256} ({found.size} bytes)"
        )
