# The Debian tools the tests use beside Python, installed where missing (scripts/test.sh runs
# this first, so a fresh machine runs every test CI runs):
#   systemd-analyze  checks the rendered systemd units (no running systemd is needed)
#   dot (graphviz)   draws status.yml's picture of the mesh
#   nginx            the front proxy the smuggling test puts in front of the gateway
#   promtool, prometheus  check /metrics, unit-test the alert rules, run the monitoring tests
#   chromium, chromedriver  the live page's browser tests
#   sshd (openssh-server)  the box-to-box checkpoint copy tests start a real sshd on 127.0.0.1
#   docker-registry  the image pin test pushes its own builds to a registry on 127.0.0.1
# The packages' own daemons are not wanted: stopped where an install started them. Needs root
# (or password-less sudo); without it, says what is missing and the tests needing it skip,
# naming it.
#   bash scripts/tools.sh
set -euo pipefail

missing=()
command -v systemd-analyze >/dev/null || missing+=(systemd)
command -v dot >/dev/null || missing+=(graphviz)
[ -x /usr/sbin/nginx ] || missing+=(nginx)
# Headless Chromium and its driver: the live page's browser tests (tests/ui) drive them.
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -x /usr/bin/chromedriver ] || missing+=(chromium-driver)
# A real sshd (and the ssh client): lobes.fleet.model_pull's tests copy a checkpoint through it.
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
# The distribution registry: the image pin test pulls a tag from it to read a real digest.
[ -x /usr/bin/docker-registry ] || missing+=(docker-registry)
# Prometheus without its recommends (exporters and their daemons).
lean=()
command -v promtool >/dev/null || lean+=(prometheus)
[ ${#missing[@]} -eq 0 ] && [ ${#lean[@]} -eq 0 ] && exit 0

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "== tools: not root, so not installing: ${missing[*]} ${lean[*]} (the tests needing them skip)" >&2
    exit 0
  fi
fi
echo "== tools: installing ${missing[*]} ${lean[*]}"
"${as_root[@]}" apt-get update -qq
install=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq)
[ ${#missing[@]} -eq 0 ] || "${install[@]}" "${missing[@]}" >/dev/null
[ ${#lean[@]} -eq 0 ] || "${install[@]}" --no-install-recommends "${lean[@]}" >/dev/null
if [ -f /run/nginx.pid ]; then "${as_root[@]}" /usr/sbin/nginx -s stop 2>/dev/null || true; fi
# The ssh service only where this run installed it: a machine reached over SSH keeps its own.
if [[ " ${missing[*]} " == *" openssh-server "* ]] && command -v systemctl >/dev/null \
    && systemctl is-active --quiet ssh 2>/dev/null; then
  "${as_root[@]}" systemctl disable --now ssh >/dev/null
fi
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  "${as_root[@]}" systemctl disable --now prometheus >/dev/null
fi
if command -v systemctl >/dev/null && systemctl is-active --quiet docker-registry 2>/dev/null; then
  "${as_root[@]}" systemctl disable --now docker-registry >/dev/null
fi
