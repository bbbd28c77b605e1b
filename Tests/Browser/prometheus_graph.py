#!/usr/bin/env python3
"""Prometheus's graph of the sign-in rate in headless Chromium (Debian's chromium and
chromium-driver, selenium from PyPI), against a running Prometheus:

opens the classic UI's graph page (the only UI Debian's prometheus ships) for
onboarding:sign_ins:rate1m over the last 5 minutes, waits until the chart has drawn a line, fails
on an error the page shows (a bad query, "No datapoints found."), and saves a screenshot.

./compose/onboarding observe runs it, after a load that makes the rate above 0; by hand:
python3 Tests/Browser/prometheus_graph.py http://127.0.0.1:9090 --screenshot /tmp/rate.png
"""
import argparse
import os
import sys
import urllib.parse

from selenium import webdriver
from selenium.common.exceptions import TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

passed = 0


def check(condition, what):
    global passed
    if not condition:
        raise AssertionError(what)
    passed += 1
    print(f"  ok  {what}")


def visible_errors(driver):
    """The text of every error alert the page shows (the graph's own and the page's)."""
    return [e.text.strip() for e in driver.find_elements(By.CSS_SELECTOR, ".alert-danger") if e.is_displayed() and e.text.strip()]


def drawn_lines(driver):
    """The series the chart has drawn: Rickshaw's `path.path` elements with a shape (the axes are
    paths of class `domain`, and an empty `stroke` path comes with each series)."""
    return [p for p in driver.find_elements(By.CSS_SELECTOR, ".graph_area svg path.path") if len(p.get_attribute("d") or "") > 10]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("prometheus", help="Prometheus's base URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--expr", default="onboarding:sign_ins:rate1m", help="what to graph")
    parser.add_argument("--range", default="5m", help="the graph's time range")
    parser.add_argument("--screenshot", default="prometheus-sign-in-rate.png", help="where to save the screenshot")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = parser.parse_args()

    query = urllib.parse.urlencode({"g0.expr": args.expr, "g0.tab": "0", "g0.range_input": args.range})
    url = f"{args.prometheus.rstrip('/')}/classic/graph?{query}"

    options = Options()
    options.binary_location = args.chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(args.chromedriver), options=options)
    try:
        print(f"Prometheus's graph of {args.expr} over {args.range}: {url}")
        driver.get(url)
        check("Prometheus" in driver.title, f"the classic graph page loads (title: {driver.title!r})")
        try:
            WebDriverWait(driver, 30, poll_frequency=0.2).until(lambda d: drawn_lines(d) or visible_errors(d))
        except TimeoutException:
            pass
        errors = visible_errors(driver)
        check(not errors, f"the page shows no error{': ' + ' / '.join(errors) if errors else ''}")
        lines = drawn_lines(driver)
        check(lines and lines[0].rect["width"] > 0, f"the chart has drawn {len(lines)} line(s)")
        legend = driver.find_element(By.CSS_SELECTOR, ".legend").text.strip()
        check(args.expr in legend, f"the legend names {args.expr}")
        os.makedirs(os.path.dirname(os.path.abspath(args.screenshot)), exist_ok=True)
        driver.save_screenshot(args.screenshot)
        check(os.path.getsize(args.screenshot) > 0, f"saved {args.screenshot}")
    except Exception as error:  # noqa: BLE001 - save what the page shows, then fail
        print(f"FAILED: {error!r}")
        failure = os.path.join(os.path.dirname(os.path.abspath(args.screenshot)), "prometheus-failure.png")
        driver.save_screenshot(failure)
        print(f"  the page as it was: {failure}")
        print(f"{passed} passed, 1 failed")
        driver.quit()
        return 1
    driver.quit()
    print(f"{passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
