#!/usr/bin/env python3
"""The demo page's whole journey in headless Chromium (Debian's chromium and chromium-driver,
selenium from PyPI), against a running gateway:

sign in (dev mode) -> the profile sheet slides up over Home when presentProfileSetup arrives on
the stream -> the username's format is judged on every keystroke and its availability once
typing has paused (one request for a name typed in one go) -> an image -> Confirm, enabled only
when the name is valid and free -> the sheet goes away on dismiss -> sign out -> sign in again
(no sheet: the profile exists) -> withdraw (the name is free again).

Saves screenshots of the open sheet and of Home. ./compose/onboarding contract runs it;
by hand: python3 Tests/Browser/demo_journey.py http://127.0.0.1:8080 --screenshots /tmp
"""
import argparse
import json
import os
import sys
import time
import urllib.request
import uuid

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WORDS = {
    "tooShort": "Too short: at least 2 characters.",
    "invalidCharacters": "Only letters A–Z, digits, Hangul (가–힣) and _ are allowed.",
}
passed = 0


def check(condition, what):
    global passed
    if not condition:
        raise AssertionError(what)
    passed += 1
    print(f"  ok  {what}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("gateway", help="the gateway's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--screenshots", default=".", help="where to save demo-sheet.png and demo-home.png")
    parser.add_argument("--image", default=os.path.join(os.path.dirname(__file__), "..", "..", "compose", "sample.png"))
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = parser.parse_args()

    options = Options()
    options.binary_location = args.chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=460,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(args.chromedriver), options=options)
    wait = WebDriverWait(driver, 20)
    by_id = lambda name: driver.find_element(By.ID, name)

    def sheet_settled(open_):
        """The sheet's class says it is open (or not) and its slide has finished."""
        classes = by_id("sheet").get_attribute("class").split()
        if ("open" in classes) != open_:
            return False
        transform = driver.execute_script("return getComputedStyle(document.getElementById('sheet')).transform")
        at_rest = transform in ("none", "matrix(1, 0, 0, 1, 0, 0)")
        return at_rest if open_ else not at_rest and driver.execute_script(
            "const r = document.getElementById('sheet').getBoundingClientRect();"
            "return r.top >= document.querySelector('.phone').getBoundingClientRect().bottom - 1")

    def availability_requests():
        return driver.execute_script(
            "return performance.getEntriesByType('resource').filter(e => e.name.includes('/v1/usernames/')).length")

    def type_slowly(element, text):
        for character in text:
            element.send_keys(character)

    try:
        subject = "browser-" + uuid.uuid4().hex[:12]
        name = "br" + uuid.uuid4().hex[:5]
        driver.get(args.gateway + "/demo")
        print(f"demo journey at {args.gateway}/demo as {subject}, username {name}")

        by_id("subject").send_keys(subject)
        by_id("sign-in").click()
        wait.until(lambda d: by_id("home").is_displayed())
        check(by_id("home").is_displayed(), "signed in: Home is shown")
        wait.until(lambda d: sheet_settled(True))
        check(True, "presentProfileSetup arrived on the stream: the sheet slid up over Home")

        username = by_id("username")
        username.send_keys("a")
        check(by_id("username-reason").text == WORDS["tooShort"], "one character: 'too short' in words at once")
        check(not by_id("confirm").is_enabled(), "Confirm is disabled while the name is invalid")
        username.send_keys(" b")
        check(by_id("username-reason").text == WORDS["invalidCharacters"], "a space: 'invalid characters' in words at once")
        username.clear()
        before = availability_requests()
        username.send_keys(name)
        wait.until(lambda d: by_id("username-reason").text.startswith("✓"))
        check(by_id("username-reason").text == f"✓ {name} is available.", "availability shown after the pause")
        check(availability_requests() - before == 1, "a name typed in one go is asked about once")
        check(by_id("confirm").is_enabled(), "Confirm is enabled once the name is valid and free")

        by_id("image").send_keys(os.path.abspath(args.image))
        wait.until(lambda d: by_id("preview").get_attribute("src"))
        screenshot = os.path.join(args.screenshots, "demo-sheet.png")
        driver.save_screenshot(screenshot)
        print(f"  saved {screenshot}")

        by_id("confirm").click()
        wait.until(lambda d: sheet_settled(False))
        check(True, "dismiss arrived on the stream: the sheet went away")
        wait.until(lambda d: by_id("greeting").text == f"Welcome, {name}")
        check(True, "Home greets the new profile")
        check(any("dismiss (profileCreated)" in line for line in by_id("log").text.splitlines()), "the stream's log shows the dismiss")
        screenshot = os.path.join(args.screenshots, "demo-home.png")
        driver.save_screenshot(screenshot)
        print(f"  saved {screenshot}")

        by_id("sign-out").click()
        wait.until(lambda d: by_id("signed-out").is_displayed())
        check(True, "signed out")
        by_id("sign-in").click()
        wait.until(lambda d: by_id("greeting").text == f"Welcome, {name}")
        check(not by_id("sheet").get_attribute("class").split().count("open"), "signed in again: the profile exists, no sheet")

        by_id("withdraw").click()
        wait.until(lambda d: by_id("signed-out").is_displayed())
        check(True, "withdrawn")
        # The clean-up follows the reply: the name is free once the profile is deleted.
        def free(_):
            with urllib.request.urlopen(f"{args.gateway}/v1/usernames/{name}", timeout=5) as reply:
                return json.load(reply)["available"]
        WebDriverWait(driver, 10, poll_frequency=0.05).until(free)
        check(True, "after the clean-up the username is free again")
    except Exception as error:  # noqa: BLE001 - print the page's state, then fail
        print(f"FAILED: {error!r}")
        print("reason:", by_id("username-reason").text if driver else "", "| log:", by_id("log").text.replace("\n", " / "))
        driver.save_screenshot(os.path.join(args.screenshots, "demo-failure.png"))
        print(f"{passed} passed, 1 failed")
        driver.quit()
        return 1
    driver.quit()
    print(f"{passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
