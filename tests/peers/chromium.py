"""Headless Chromium from Debian driven by Selenium (PEERS.md §12): nothing is downloaded;
Selenium is given both the browser and the driver, so Selenium Manager stays idle.

Selenium's calls block (HTTP to chromedriver): async tests run them with
``asyncio.to_thread`` so the server under test, on the test's loop, keeps answering."""

from __future__ import annotations

import glob
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

BROWSER: Final = "/usr/bin/chromium"
DRIVER: Final = "/usr/bin/chromedriver"
FLAGS: Final = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run",
                "--disable-quic", "--window-size=1280,900", "--disable-dev-shm-usage")


def chromium_unavailable_reason() -> str | None:
    for path, package in ((BROWSER, "chromium"), (DRIVER, "chromium-driver")):
        if not Path(path).exists():
            return f"{path} is missing: apt-get install {package} (scripts/setup.sh)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed: pip install -e '.[test]'"
    return None


@contextmanager
def running_chromium() -> Iterator[object]:
    """A headless Chromium with a fresh profile; quit and cleaned up afterwards."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="pv-chromium-")
    before = set(glob.glob("/tmp/org.chromium.Chromium.*"))
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
        for left in set(glob.glob("/tmp/org.chromium.Chromium.*")) - before:
            shutil.rmtree(left, ignore_errors=True)
