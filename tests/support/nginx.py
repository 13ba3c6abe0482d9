"""A real nginx in front of a gateway, as operators run one: its own rules (here, /v1/ refused)
and a keep-alive pool of upstream connections, which is where a request smuggled past the
rules would ride."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.support.ports import free_port
from tests.support.tools import not_installed
from tests.support.wait import http_ok, wait_until

NGINX_MISSING = not_installed("nginx", "nginx")

_CONF = """\
{user}worker_processes 1;
daemon off;
master_process off;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream gateway {{
        server 127.0.0.1:{upstream};
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        # The operator's rule: the inference API is not for this front's callers.
        location /v1/ {{ return 403; }}
        location / {{
            proxy_pass http://gateway;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
        }}
    }}
}}
"""


def nginx_binary() -> str | None:
    return shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists()
                                     else None)


class FrontProxy:
    """nginx on a free 127.0.0.1 port proxying to `upstream_port`; a context manager."""

    def __init__(self, binary: str, upstream_port: int) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = Path(tempfile.mkdtemp(prefix="lobes-nginx-"))
        conf = self._dir / "nginx.conf"
        conf.write_text(_CONF.format(user="user root;\n" if os.geteuid() == 0 else "",
                                     dir=self._dir, upstream=upstream_port, port=self.port))
        self._proc = subprocess.Popen([binary, "-c", str(conf), "-p", str(self._dir)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(lambda: http_ok(f"{self.url}/health"), message="nginx in front")

    def __enter__(self) -> FrontProxy:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._proc.terminate()
        self._proc.wait(timeout=10)
        shutil.rmtree(self._dir, ignore_errors=True)
