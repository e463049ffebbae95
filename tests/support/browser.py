"""Headless Chromium for the chat page's tests (Debian's chromium + chromium-driver, driven by Selenium)."""

from __future__ import annotations

import os
import shutil
import time

import pytest

from .require import require


def chromium():
    """Headless Chromium through chromedriver: CI must have them, elsewhere skip."""
    webdriver = require("selenium.webdriver")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (binary and driver):
        if os.environ.get("CI"):
            pytest.fail("chromium and chromedriver are missing: apt-get install chromium chromium-driver")
        pytest.skip("needs chromium and chromedriver (apt-get install chromium chromium-driver)")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(flag)
    return webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver))


def until(condition, what: str, seconds: float = 120):
    deadline = time.monotonic() + seconds
    while not (found := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found
