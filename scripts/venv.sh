# Source me: creates or refreshes .venv from a pinned requirements file, then
# activates it and exposes the collection as lobes.fleet.
#   . scripts/venv.sh requirements.txt
set -e
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_req="${1:-requirements.txt}"
if [ ! -x "$_root/.venv/bin/python" ]; then
  python3 -m venv "$_root/.venv"
fi
_stamp="$_root/.venv/.stamp-$(basename "$_req")"
_want="$(cat "$_root/requirements.txt" "$_root/$_req" | sha256sum | cut -c1-16)"
if [ "$(cat "$_stamp" 2>/dev/null)" != "$_want" ]; then
  "$_root/.venv/bin/pip" install --quiet --disable-pip-version-check -r "$_root/$_req"
  echo "$_want" > "$_stamp"
fi
# ansible_collections/lobes/fleet must resolve to this checkout.
mkdir -p "$_root/.collections/ansible_collections/lobes"
ln -sfn "$_root" "$_root/.collections/ansible_collections/lobes/fleet"
export ANSIBLE_COLLECTIONS_PATH="$_root/.collections"
export ANSIBLE_CONFIG="$_root/ansible.cfg"
export PATH="$_root/.venv/bin:$PATH"
unset _req _stamp _want
