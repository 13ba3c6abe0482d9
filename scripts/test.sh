# The whole test job: lint, unit and integration tests, Ansible lint and sanity.
# Creates its own venv from the pinned requirements-dev.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh requirements-dev.txt
echo "== ruff"
ruff check .
# The simulator's calibration is asserted against wall time (seed 000's figures within 10%):
# it runs alone first, so no other test competes for the two cores while it is measured.
echo "== pytest: simulator calibration (alone)"
python -m pytest -q tests/sim/test_calibration.py
echo "== pytest: everything else"
python -m pytest -q -n 2 --ignore=tests/sim/test_calibration.py tests
echo "== yamllint and ansible-lint"
bash scripts/lint.sh
echo "== ansible-test sanity"
bash scripts/sanity.sh
