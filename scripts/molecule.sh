# The molecule scenarios, for CI and people: a Docker engine (scripts/engine.sh), the dev venv,
# then `molecule test -s <scenario>` for each scenario given (default: every directory under
# extensions/molecule but shared). Stops what it started, even on failure: the scenarios'
# containers and networks (molecule destroy) and the engine when it was not running before.
#   bash scripts/molecule.sh [scenario...]
set -euo pipefail
cd "$(dirname "$0")/.."

engine_was_running=false
docker info >/dev/null 2>&1 && engine_was_running=true

scenarios=("$@")
if [ ${#scenarios[@]} -eq 0 ]; then
  for dir in extensions/molecule/*/; do
    name=$(basename "$dir")
    [ "$name" = shared ] || scenarios+=("$name")
  done
fi

cleanup() {
  local status=$?
  set +e
  [ -x .venv/bin/molecule ] || scenarios=()  # nothing was created without molecule
  for scenario in "${scenarios[@]}"; do
    .venv/bin/molecule destroy -s "$scenario" >/dev/null 2>&1 || echo "== molecule: destroy $scenario failed" >&2
  done
  if [ "$engine_was_running" = false ]; then
    bash scripts/engine.sh down
  fi
  exit "$status"
}

trap cleanup EXIT
bash scripts/engine.sh up
# venv.sh puts .venv/bin first on PATH (molecule calls ansible-config from PATH) and points
# ANSIBLE_COLLECTIONS_PATH at .collections, where lobes.fleet is this checkout. Molecule writes
# its own ansible.cfg, so the checkout's (inventories/local by default) must not be forced.
. scripts/venv.sh requirements-dev.txt
unset ANSIBLE_CONFIG

for scenario in "${scenarios[@]}"; do
  echo "== molecule test -s $scenario"
  started=$SECONDS
  molecule test -s "$scenario"
  echo "== molecule: $scenario passed in $((SECONDS - started)) s"
done
