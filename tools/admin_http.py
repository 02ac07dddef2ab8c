"""Example: drive a broker's HTTP management API from a script (log in, CSRF, disable/enable).

    SCALE0_AUTH_ID=admin SCALE0_AUTH_PASSWORD=... \\
        python tools/admin_http.py http://127.0.0.1:8480 status
    python tools/admin_http.py http://127.0.0.1:8480 disable b2
    python tools/admin_http.py http://127.0.0.1:8480 enable b2

Standard library only. Prints the JSON answer; exits 0 when the command answered 200.
See docs/management.md for the API and its defences (Origin, X-CSRF-Token, the cookie).
"""

from __future__ import annotations

import http.cookiejar
import json
import os
import sys
import urllib.error
import urllib.request
from typing import Any


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] not in ("status", "disable", "enable"):
        print(__doc__, file=sys.stderr)
        return 2
    base, command = argv[0].rstrip("/"), argv[1]
    if not base.startswith(("http://", "https://")):
        print(f"admin_http: {base!r} is not an http(s) URL", file=sys.stderr)
        return 2
    target = argv[2] if len(argv) > 2 else None
    auth_id = os.environ.get("SCALE0_AUTH_ID", "")
    password = os.environ.get("SCALE0_AUTH_PASSWORD", "")
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )

    def call(method: str, path: str, body: Any = None, csrf: str | None = None) -> Any:
        headers = {"Origin": base}  # same-origin: the server refuses other Origins
        data = None
        if method == "POST":
            headers["Content-Type"] = "application/json"
            data = json.dumps(body or {}).encode()
        if csrf is not None:
            headers["X-CSRF-Token"] = csrf
        # The scheme was checked in main(): only http(s) URLs get here.
        request = urllib.request.Request(base + path, data, headers, method=method)  # noqa: S310
        try:
            with opener.open(request, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            answer = json.load(error)
            print(f"{method} {path}: HTTP {error.code}: {answer.get('message')}", file=sys.stderr)
            raise SystemExit(1) from None

    session = call("POST", "/api/login", {"auth_id": auth_id, "password": password})
    if command == "status":
        answer = call("GET", "/api/status?family=true")
    else:
        args = {"broker": target} if target else {}
        answer = call("POST", f"/api/{command}", args, csrf=session["csrf_token"])
    call("POST", "/api/logout", {}, csrf=session["csrf_token"])
    print(json.dumps(answer, indent=2))
    return 0 if answer.get("code") == 200 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
