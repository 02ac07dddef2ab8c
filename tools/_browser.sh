#!/usr/bin/env bash
# Run by tools/test: the management page is tested in a real headless Chromium driven through
# chromium-driver (tests/system/test_management_browser.py), Debian's packages, version-matched
# by apt. Installs them when missing and we may (root, apt-get); otherwise stops with one line
# saying what to do. Skipped when the pytest arguments leave the browser tests out.
# SCALE0_CHROMIUM / SCALE0_CHROMEDRIVER name other paths to check, SCALE0_NO_INSTALL=1 forbids
# installing (tests/test_docs.py checks the one line that is printed then).
set -euo pipefail
chromium=${SCALE0_CHROMIUM:-/usr/bin/chromium}
chromedriver=${SCALE0_CHROMEDRIVER:-/usr/bin/chromedriver}
browser_tests=tests/system/test_management_browser.py
for arg in "$@"; do
    case "$arg" in
        --ignore=$browser_tests | --deselect=$browser_tests) exit 0 ;;
    esac
done
if [ -x "$chromium" ] && [ -x "$chromedriver" ]; then
    exit 0
fi
if [ "${SCALE0_NO_INSTALL:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== installing chromium and chromium-driver (apt-get) for the management page's tests"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core \
        >/dev/null
    exit 0
fi
echo "tools/test: the browser tests need $chromium and $chromedriver:" \
    "run 'sudo apt-get install chromium chromium-driver', or leave them out with" \
    "'tools/test --ignore=$browser_tests'" >&2
exit 1
