#!/usr/bin/env bash
# The QAIRT build-box environment: a Python 3.12 venv (default .venv-qairt/) with qairt-dev 0.13.0 and genie-build
# (editable, from this checkout), pinned by envs/requirements-qairt.txt, plus the test requirements.
#   scripts/make_qairt_env.sh [VENV_DIR]
# Python 3.12 is taken from $QAIRT_ENV_PYTHON, else python3.12 on PATH, else the newest pyenv 3.12.
# A second run with unchanged requirements only checks the environment (a stamp file holds their hash).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${1:-$repo/.venv-qairt}
requirements=("$repo/envs/requirements-qairt.txt" "$repo/envs/requirements-test.txt")
stamp="$venv/.genie-build-requirements.sha256"
wanted=$(cat "${requirements[@]}" "$repo/pyproject.toml" | sha256sum | cut -d' ' -f1)

is_312() { "$1" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' > /dev/null 2>&1; }

find_python() {
  local candidate
  for candidate in "${QAIRT_ENV_PYTHON:-}" "$(command -v python3.12 || true)" \
      $(command -v pyenv > /dev/null && ls -d "$(pyenv root)"/versions/3.12*/bin/python3.12 2> /dev/null | sort -rV); do
    if [ -n "$candidate" ] && is_312 "$candidate"; then echo "$candidate"; return; fi
  done
  echo "make_qairt_env.sh: error: no Python 3.12 found (qairt-dev 0.13.0 needs 3.10 or 3.12): set QAIRT_ENV_PYTHON" >&2
  exit 2
}

# The editable install must point at this checkout, or the env tests another tree.
in_this_checkout() {
  "$venv/bin/python" -c "import genie_build, sys; sys.exit(not genie_build.__file__.startswith('$repo/'))" 2> /dev/null
}

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2> /dev/null)" = "$wanted" ] && in_this_checkout; then
  echo "make_qairt_env.sh: $venv is up to date"
  exit 0
fi
python=$(find_python)
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "${requirements[@]/#/-r}" -e "$repo"
"$venv/bin/pip" check
echo "$wanted" > "$stamp"
echo "make_qairt_env.sh: created $venv ($("$venv/bin/python" --version), qairt-dev $("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("qairt-dev"))'))"
