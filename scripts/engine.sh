# A real Docker engine for the compose runtime and the molecule scenarios, on a machine that
# starts without one (see docs/testing.md). Idempotent: each step is skipped when done already.
#   bash scripts/engine.sh up     install and start the engine, fetch Compose v2, build images
#   bash scripts/engine.sh down   stop the engine if this script started it
# Images (no registry is reachable, so all are built here from Debian's own packages):
#   lobes/base:bookworm  debootstrap minbase + python3, sshd, iproute2, procps (gateway, sim, hosts)
#   lobes/box:bookworm   base + the docker CLI and Compose plugin (a box driving a compose project)
#   lobes/engine-box:bookworm   base + libnuma1 (a box running vLLM's CPU build)
set -euo pipefail
cd "$(dirname "$0")/.."

ENGINE_DIR=/var/lib/lobes-engine
RUN_DIR=/run/lobes-engine
PIDFILE=$RUN_DIR/dockerd.pid
COMPOSE_VERSION=2.26.1-4
COMPOSE_DEB_SHA256=47681197cb2b1ab88206b42a1a92fc75f50d9530a6322d03494a473eed0408ea
COMPOSE_BIN_SHA256=c0ef2e286ba1c45bf1868b70a1c71d30a802bb3996888f2f986c3166f9e45f57
PLUGIN=/usr/libexec/docker/cli-plugins/docker-compose
DEBIAN_URI=http://deb.debian.org/debian
BASE_IMAGE=lobes/base:bookworm
BOX_IMAGE=lobes/box:bookworm
ENGINE_BOX_IMAGE=lobes/engine-box:bookworm
export DEBIAN_FRONTEND=noninteractive

say() { echo "== engine: $*"; }

install_packages() {
  local missing=()
  command -v dockerd >/dev/null || missing+=(docker.io)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v ssh >/dev/null || missing+=(openssh-client)
  # The mesh scenario's monitoring box runs the host's Prometheus (mounted into its container).
  command -v prometheus >/dev/null || missing+=(prometheus)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq
    apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# Debian 12 packages only Compose v1; Debian 13's docker-compose holds the v2 plugin. Fetched
# with a separate apt configuration so the machine's own stays untouched; checked by sha256.
install_compose_plugin() {
  if [ -x "$PLUGIN" ] && echo "$COMPOSE_BIN_SHA256  $PLUGIN" | sha256sum -c --status; then
    return
  fi
  say "fetching the Compose v2 plugin $COMPOSE_VERSION"
  local work
  work=$(mktemp -d)
  mkdir -p "$work/lists/partial" "$work/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $DEBIAN_URI trixie main" \
    >"$work/sources.list"
  local apt_opts=(-o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$work/lists" -o "Dir::Cache=$work/cache")
  apt-get "${apt_opts[@]}" update -qq
  (cd "$work" && apt-get "${apt_opts[@]}" download -qq "docker-compose=$COMPOSE_VERSION" 2>/dev/null)
  echo "$COMPOSE_DEB_SHA256  $work/docker-compose_${COMPOSE_VERSION}_amd64.deb" | sha256sum -c --quiet
  dpkg-deb -x "$work/docker-compose_${COMPOSE_VERSION}_amd64.deb" "$work/root"
  install -D -m 0755 "$work/root$PLUGIN" "$PLUGIN"
  echo "$COMPOSE_BIN_SHA256  $PLUGIN" | sha256sum -c --quiet
  rm -rf "$work"
}

engine_running() { docker info >/dev/null 2>&1; }

start_engine() {
  if engine_running; then
    return
  fi
  say "starting dockerd"
  mkdir -p "$ENGINE_DIR" "$RUN_DIR"
  dockerd --data-root "$ENGINE_DIR/data" --exec-root "$RUN_DIR/exec" --pidfile "$PIDFILE" \
    >"$RUN_DIR/dockerd.log" 2>&1 &
  for _ in $(seq 1 60); do
    engine_running && return
    sleep 0.5
  done
  echo "dockerd did not start; see $RUN_DIR/dockerd.log" >&2
  tail -20 "$RUN_DIR/dockerd.log" >&2
  exit 1
}

build_base_image() {
  if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    return
  fi
  say "building $BASE_IMAGE with debootstrap"
  local rootfs
  rootfs=$(mktemp -d)
  debootstrap --variant=minbase --include=python3,openssh-server,iproute2,procps \
    bookworm "$rootfs" "$DEBIAN_URI" >/dev/null
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
}

build_box_image() {
  if docker image inspect "$BOX_IMAGE" >/dev/null 2>&1; then
    return
  fi
  say "building $BOX_IMAGE"
  local context
  context=$(mktemp -d)
  cp /usr/bin/docker "$context/docker"
  cp "$PLUGIN" "$context/docker-compose"
  cat >"$context/Dockerfile" <<EOF
FROM $BASE_IMAGE
COPY docker /usr/bin/docker
COPY docker-compose $PLUGIN
EOF
  docker build -q -t "$BOX_IMAGE" "$context" >/dev/null
  rm -rf "$context"
}

# vLLM's CPU build loads libnuma from the system. The package is fetched here (the containers
# reach no mirror) and installed into the image.
build_engine_box_image() {
  if docker image inspect "$ENGINE_BOX_IMAGE" >/dev/null 2>&1; then
    return
  fi
  say "building $ENGINE_BOX_IMAGE"
  local context
  context=$(mktemp -d)
  (cd "$context" && apt-get download -qq libnuma1)
  printf '%s\n' "FROM $BASE_IMAGE" "COPY libnuma1_*.deb /tmp/" \
    "RUN dpkg -i /tmp/libnuma1_*.deb && rm /tmp/libnuma1_*.deb" >"$context/Dockerfile"
  docker build -q -t "$ENGINE_BOX_IMAGE" "$context" >/dev/null
  rm -rf "$context"
}

# Stops the daemon only when this script started it (its pidfile), with what it left running.
stop_engine() {
  [ -f "$PIDFILE" ] || return 0
  local pid
  pid=$(cat "$PIDFILE")
  if kill -0 "$pid" 2>/dev/null; then
    say "stopping dockerd ($pid)"
    local running
    running=$(docker ps -q)
    [ -z "$running" ] || docker rm -f $running >/dev/null
    kill "$pid"
    for _ in $(seq 1 60); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
  fi
  rm -f "$PIDFILE"
}

case "${1:-up}" in
  up)
    install_packages
    install_compose_plugin
    start_engine
    build_base_image
    build_box_image
    build_engine_box_image
    docker compose version
    ;;
  down) stop_engine ;;
  *) echo "usage: bash scripts/engine.sh [up|down]" >&2; exit 2 ;;
esac
