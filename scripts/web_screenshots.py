"""Screenshots of the web page's three views for the docs, from a running ``speclive serve``.

    speclive serve --port 8123 &
    python scripts/web_screenshots.py http://127.0.0.1:8123 docs/img

Headless Chromium with a spoken question (Piper) as its fake microphone, driven the way
``tests/test_realtime.py`` drives it (its helpers are reused); needs chromium, chromedriver and
selenium.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_realtime import QUESTION, _browser, _chromium, _spoken_wav, _wait  # noqa: E402

STATEMENT = "The weather is nice today, so we are going to the park."


def _shoot(url: str, out: str, text: str, mode: str, ready: str) -> None:
    binary, driver = _chromium()
    with tempfile.TemporaryDirectory() as tmp:
        drv = _browser(binary, driver, _spoken_wav(Path(tmp), text))
        try:
            drv.get(url.rstrip("/") + "/")
            drv.find_element("css selector", f".tab[data-mode={mode}]").click()
            drv.find_element("css selector", "#mic").click()
            _wait(drv, f"return Number(document.body.dataset.{ready} || 0) >= 1", 180)
            if mode == "chat":
                _wait(drv, "return Number(document.body.dataset.playedMs || 0) > 300", 60)
            time.sleep(1.0)
            drv.save_screenshot(f"{out}/web-{mode}.png")
        finally:
            drv.quit()


def main(url: str, out: str) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    _shoot(url, out, QUESTION, "chat", "answers")
    _shoot(url, out, STATEMENT, "translate", "translations")
    _shoot(url, out, STATEMENT, "transcribe", "transcripts")
    print(f"wrote {out}/web-chat.png, web-translate.png, web-transcribe.png")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
