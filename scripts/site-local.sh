# The embedded default: site.yml against inventories/local (no GPU, no Docker).
# Leaves a gateway on http://127.0.0.1:8000 in front of simulated gears.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/venv.sh requirements.txt
ansible-playbook -i inventories/local playbooks/site.yml "$@"
