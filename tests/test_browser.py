"""The server's page in a real browser: headless Chromium (Debian's chromium and chromium-driver) driven by
selenium types a sentence, clicks Translate and reads back what the JSON API gives; a screenshot is written beside
the test output. Marked `browser`; skipped, with the reason, where no browser is installed (.ci/run installs one)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not (CHROMIUM and DRIVER), reason="no Chromium and chromedriver (apt-get install chromium chromium-driver)"
    ),  # fmt: skip
]


def serving(checkpoint, *args):
    """serve.py on a free port of 127.0.0.1, until the generator ends: yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen([sys.executable, "serve.py", f"checkpoint={checkpoint}", "device=cpu", f"port={port}", *args],
                         cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(url + "/health", timeout=1)
            break
        except OSError:
            if p.poll() is not None:
                pytest.fail(p.stderr.read()[-2000:])
            time.sleep(0.25)
    yield url
    p.terminate()
    p.wait(timeout=30)


@pytest.fixture
def server(toy_run):
    yield from serving(toy_run)


@pytest.fixture
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1000,800"):  # fmt: skip
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=DRIVER), options=options)
    yield driver
    driver.quit()


def api(url: str, body: dict, key: str | None = None) -> dict:
    headers = {"content-type": "application/json", **({"x-api-key": key} if key else {})}
    request = urllib.request.Request(url + "/translate", json.dumps(body).encode(), headers)
    return json.loads(urllib.request.urlopen(request, timeout=60).read())


def test_typing_and_clicking_gives_the_apis_translation(server, browser, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(server)
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: "xx" in d.find_element(By.ID, "model").text)  # the model's languages, from /info
    box = browser.find_element(By.ID, "src")
    box.send_keys("the cat sees a dog")
    browser.find_element(By.ID, "go").click()
    shown = wait.until(lambda d: [li.text for li in d.find_elements(By.CSS_SELECTOR, "#out > li .text")] or None)
    answer = api(server, {"src": ["the cat sees a dog"]})
    assert shown == answer["translations"]
    score = browser.find_element(By.CSS_SELECTOR, "#out > li .score").text  # each line's score and flags
    assert score == f"{answer['scores'][0]:.2f}"
    assert [f.text for f in browser.find_elements(By.CSS_SELECTOR, "#out > li .flag")] == answer["flags"][0]
    # a pasted three-sentence paragraph is split (on by default in the page) and comes back as one line
    box.clear()
    box.send_keys("the cat sees a dog. a small tree runs. the red house is big.")
    browser.find_element(By.ID, "go").click()
    split = api(server, {"src": ["the cat sees a dog. a small tree runs. the red house is big."], "split": True})[
        "translations"
    ]
    assert wait.until(
        lambda d: [li.text for li in d.find_elements(By.CSS_SELECTOR, "#out > li .text")] == split or None
    )
    assert browser.execute_script("return request()")["split"] is True
    box.clear()
    box.send_keys("the cat sees a dog")
    browser.save_screenshot(str(tmp_path / "page.png"))
    assert (tmp_path / "page.png").stat().st_size > 1000
    print("screenshot:", tmp_path / "page.png")
    # Ctrl+Enter, two lines, and an error from the API shown on the page
    box.send_keys(Keys.ENTER, "a small tree")
    browser.find_element(By.ID, "nbest").clear()
    browser.find_element(By.ID, "nbest").send_keys("99")
    box.send_keys(Keys.CONTROL, Keys.ENTER)
    error = wait.until(lambda d: d.find_element(By.ID, "error").text or None)
    assert error == api_error(server, {"src": ["the cat sees a dog", "a small tree"], "nbest": 99})
    for field, value in (("nbest", "2"), ("beam", "2")):
        browser.find_element(By.ID, field).clear()
        browser.find_element(By.ID, field).send_keys(value)
    box.send_keys(Keys.CONTROL, Keys.ENTER)
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#out .nbest li")) == 4)
    first = browser.find_elements(By.CSS_SELECTOR, "#out > li")[0].find_elements(By.CSS_SELECTOR, "li")[0]
    body = {"src": ["the cat sees a dog", "a small tree"], "nbest": 2, "beam_size": 2}
    expected = api(server, body)["translations"][0][0]
    assert first.text.startswith(expected["text"])
    Path(tmp_path / "page_nbest.png").write_bytes(browser.get_screenshot_as_png())


def api_error(url: str, body: dict) -> str:
    try:
        api(url, body)
    except urllib.error.HTTPError as e:
        return json.loads(e.read())["error"]
    pytest.fail("the API accepted a request it should refuse")


def test_a_multilingual_model_gets_a_language_choice_and_samples_differ(multilingual_run, browser):
    """Before: the page never sent tgt_lang (a multilingual model without a default answered 422 to every request,
    with no field to fix it) nor a seed (every sampling click drew the same sample), and its header named one
    direction."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    for url in serving(multilingual_run[0]):
        browser.get(url)
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: "xx \u2192 yy, zz" in d.find_element(By.ID, "model").text)
        Select(browser.find_element(By.ID, "tgt")).select_by_value("zz")
        browser.find_element(By.ID, "src").send_keys("the cat sees a dog")
        browser.find_element(By.ID, "go").click()
        shown = wait.until(lambda d: [li.text for li in d.find_elements(By.CSS_SELECTOR, "#out > li .text")] or None)
        assert shown == api(url, {"src": ["the cat sees a dog"], "tgt_lang": "zz"})["translations"]
        browser.find_element(By.ID, "sampling").click()
        first, second = browser.execute_script("return [request(), request()]")
        assert first["tgt_lang"] == "zz" and first["sampling"] and first["seed"] != second["seed"]


def test_with_keys_the_page_asks_for_one_and_picks_among_several_models(toy_run, browser, tmp_path):
    """A server with api_keys and two models: the page says it needs a key and shows the key field; once a key is
    typed it reads /info, offers the models, and translates with the key and the chosen model."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    keys = tmp_path / "keys.txt"
    keys.write_text("tester:page-key-0123456789\n")
    for url in serving(f"{{first: {toy_run}, second: {toy_run}}}", f"api_keys={keys}"):
        browser.get(url)
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: "needs an API key" in d.find_element(By.ID, "model").text)
        field = browser.find_element(By.ID, "key")
        assert field.is_displayed() and "no API key" in browser.find_element(By.ID, "error").text
        field.send_keys("page-key-0123456789", Keys.ENTER)
        wait.until(lambda d: "xx" in d.find_element(By.ID, "model").text)
        picker = Select(browser.find_element(By.ID, "pick"))
        assert [o.get_attribute("value") for o in picker.options] == ["first", "second"]
        picker.select_by_value("second")
        browser.find_element(By.ID, "src").send_keys("the cat sees a dog")
        browser.find_element(By.ID, "go").click()
        shown = wait.until(lambda d: [li.text for li in d.find_elements(By.CSS_SELECTOR, "#out > li .text")] or None)
        expected = api(url, {"src": ["the cat sees a dog"], "model": "second"}, "page-key-0123456789")
        assert shown == expected["translations"] and browser.execute_script("return request()")["model"] == "second"


def test_the_guide_and_results_tables_fit_the_page_at_1280_pixels(browser, tmp_path):
    """Beside the navigation and the contents, a table wider than its column scrolls sideways: the guide's pages and
    the results page keep every table within it (docs/stylesheets/extra.css)."""
    subprocess.run(["mkdocs", "build", "-q", "-d", str(tmp_path / "site")], cwd=ROOT, check=True,
                   env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    browser.set_window_size(1280, 900)
    site = tmp_path / "site"
    pages = [p for p in site.rglob("index.html") if "experiments" not in p.parts and p.parent.name != "404"]
    assert len(pages) > 10
    wide = {}
    for page in pages:
        browser.get(page.as_uri())
        over = browser.execute_script(
            "return [...document.querySelectorAll('.md-typeset table')].map(t => [t.scrollWidth,"
            " (t.closest('.md-typeset__scrollwrap') || t.parentElement).clientWidth]).filter(([w, c]) => w > c + 2)"
        )
        if over:
            wide[str(page.parent.relative_to(tmp_path / "site"))] = over
    assert not wide, f"tables wider than the page's column (scrollWidth, column): {wide}"
