# ansible-test sanity on a copy of the collection, without Docker.
#   bash scripts/sanity.sh [extra ansible-test sanity args, e.g. --test validate-modules]
# ansible-test needs the collection at .../ansible_collections/lobes/fleet inside a git
# checkout whose .gitignore ignores /tests/output/; the copy holds the working tree's tracked
# and untracked-but-not-ignored files, so uncommitted work is tested too.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh requirements-dev.txt
# A persistent copy outside the checkout, so ansible-test's venvs under tests/output stay warm.
work="${LOBES_SANITY_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lobes-fleet-sanity/$(pwd | sha256sum | cut -c1-12)}"
copy="$work/ansible_collections/lobes/fleet"
mkdir -p "$copy"
find "$copy" -mindepth 1 -maxdepth 1 ! -name tests -exec rm -rf {} +
find "$copy/tests" -mindepth 1 -maxdepth 1 ! -name output -exec rm -rf {} + 2>/dev/null || true
git ls-files -z --cached --others --exclude-standard \
  | grep -zv -E '^(\.venv|\.collections)$' \
  | xargs -0 -I{} sh -c 'test -e "{}" && printf "%s\0" "{}"' \
  | tar --null -T - -cf - | tar -xf - -C "$copy"
git -C "$copy" init -q
git -C "$copy" add -A

# ansible-test bootstraps pip in its venvs with a get-pip script from a host this machine
# cannot reach; it uses a cached copy first. Ours installs pip with ensurepip (in a
# subprocess, which keeps the pip configuration and its CA settings), then the requested
# pip version from the configured package index.
pip_version="$(python - <<'PY'
from ansible_test._internal.python_requirements import get_venv_packages
from ansible_test._internal.host_configs import NativePythonConfig
print(get_venv_packages(NativePythonConfig(version="3.11", path="/usr/bin/python3"))["pip"])
PY
)"
cache="$HOME/.ansible/test/cache/get_pip_${pip_version//./_}.py"
if ! grep -q "lobes.fleet" "$cache" 2>/dev/null; then
  mkdir -p "$(dirname "$cache")"
  cat > "$cache" <<'PY'
"""lobes.fleet stand-in for get-pip.py: ensurepip, then pip installs what get-pip was asked for."""
import subprocess
import sys

subprocess.run([sys.executable, "-m", "ensurepip", "--default-pip"], check=True)
# get-pip's own options mean nothing to pip install.
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
subprocess.run([sys.executable, "-m", "pip", "install", *args], check=True)
PY
fi

cd "$copy"
ansible-test sanity --venv --python 3.11 --color no "$@"
