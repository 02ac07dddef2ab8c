# Sourced by tools/*: make (once) and activate .venv with Scale0 installed editable + test extras.
# Reinstalls when setup.cfg changes, so a pulled dependency change is picked up by the next run.
venv=${SCALE0_VENV:-.venv}
stamp="$venv/.scale0-installed"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if [ ! -f "$stamp" ] || ! cmp -s setup.cfg "$stamp"; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e ".[test]"
    cp setup.cfg "$stamp"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
