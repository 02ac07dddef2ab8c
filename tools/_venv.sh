# Sourced by tools/*: make (once) and activate .venv with Scale0 installed editable + test extras.
# Reinstalls when setup.cfg, setup.py or the C extension's source changes, so a pulled dependency
# change is picked up, and the extension rebuilt, by the next run.
# SCALE0_VENV_READY=1 uses the environment as it is: tests/test_docs_commands.py runs the docs'
# commands in a copy of the tree, and a reinstall from that copy would point the environment
# under test at the copy (which is deleted afterwards).
venv=${SCALE0_VENV:-.venv}
stamp="$venv/.scale0-installed"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
inputs="setup.cfg setup.py scale0/net/_zmqio.c scale0/core/_pool.c"
# shellcheck disable=SC2086
if [ -z "${SCALE0_VENV_READY:-}" ] && [ -L "$venv" ] && ! cat $inputs | cmp -s - "$stamp"; then
    # A venv borrowed from another checkout (a git worktree's .venv linked to the main one):
    # reinstalling would point that checkout's environment at this tree. Build this tree's
    # C extension in place instead, and leave the venv and its stamp to their owner.
    echo "tools/_venv.sh: $venv is a link; building this tree's extension in place," \
        "not reinstalling (new dependencies in setup.cfg: install them by hand)" >&2
    "$venv/bin/python" setup.py --quiet build_ext --inplace
elif [ -z "${SCALE0_VENV_READY:-}" ] && { [ ! -f "$stamp" ] || ! cat $inputs | cmp -s - "$stamp"; }; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e ".[test]"
    # shellcheck disable=SC2086
    cat $inputs >"$stamp"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"
