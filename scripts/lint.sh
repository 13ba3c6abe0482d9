# ansible-lint (production profile, offline) and yamllint over the collection.
#   bash scripts/lint.sh
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh requirements-dev.txt
echo "== yamllint"
yamllint --strict .
echo "== ansible-lint (production profile)"
ansible-lint --offline
