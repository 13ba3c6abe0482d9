# The whole test job: lint, unit and integration tests, Ansible lint and sanity.
# Creates its own venv from the pinned requirements-dev.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh requirements-dev.txt
echo "== ruff"
ruff check .
echo "== pytest"
python -m pytest -q tests
echo "== yamllint and ansible-lint"
bash scripts/lint.sh
echo "== ansible-test sanity"
bash scripts/sanity.sh
