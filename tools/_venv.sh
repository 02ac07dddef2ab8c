# Sourced by tools/*: make (once) and activate .venv with Scale0 installed editable + test extras.
# Reinstalls when setup.cfg, setup.py or the C extension's source changes, so a pulled dependency
# change is picked up, and the extension rebuilt, by the next run.
venv=${SCALE0_VENV:-.venv}
stamp="$venv/.scale0-installed"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
inputs="setup.cfg setup.py scale0/net/_zmqio.c"
# shellcheck disable=SC2086
if [ ! -f "$stamp" ] || ! cat $inputs | cmp -s - "$stamp"; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e ".[test]"
    # shellcheck disable=SC2086
    cat $inputs >"$stamp"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
