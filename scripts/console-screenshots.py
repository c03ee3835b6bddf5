"""Screenshots of the console's Live and Devices pages after the default demo (docs/img/).

Runs ``peep demo --console`` at its defaults, changes the admin's one-time password, and saves the two pages
with headless Debian Chromium (``scripts/bootstrap.sh`` installs it) through the demo test's own helper.

Usage: SCIKIT_LEARN_DATA=... .venv/bin/python scripts/console-screenshots.py [OUT]   (default docs/img, ignored by git)
"""

from __future__ import annotations

import re
import ssl
import sys
import tempfile
from pathlib import Path

import httpx

root = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(root / "tests" / "demo"))

from peep.lab.demo import Demo, DemoOptions  # noqa: E402
from test_demo import save_screenshots  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else root / "docs" / "img"
    with tempfile.TemporaryDirectory() as tmp:
        demo = Demo(DemoOptions(out=Path(tmp) / "run", console=True), say=lambda m: print(m, flush=True))
        try:
            c = demo.run()["console"]
            ctx = ssl.create_default_context(cafile=c["ca_cert"])
            new = "ochre lantern tundra whistle marmalade"
            with httpx.Client(base_url=c["url"], verify=ctx, timeout=30) as web:

                def csrf(path: str) -> str:
                    m = re.search(r'name="csrf" value="([^"]*)"', web.get(path).text)
                    assert m, path
                    return m.group(1)

                web.post("/login", data={"name": "admin", "password": demo.console_password, "csrf": csrf("/login")})
                form = {"current": demo.console_password, "new": new, "again": new, "csrf": csrf("/password")}
                web.post("/password", data=form)
            save_screenshots(c["url"], new, out, Path(tmp))
        finally:
            demo.close()
    print(f"console-live.png and console-devices.png written to {out}")


if __name__ == "__main__":
    main()
