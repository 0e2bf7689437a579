"""Screenshots for the docs, from a real browser (headless Chromium driven by selenium, as tests/test_browser.py):

    python benchmarks/reliability/screenshots.py serve RUN_DIR docs/serve_page.png [--text "A man is ..."]
    python benchmarks/reliability/screenshots.py site OUT_DIR [--pages README index auto concepts results]

`serve` starts `serve.py checkpoint=RUN_DIR` on a free port, types the text into its page, clicks Translate,
waits for the answer and saves the page. `site` builds the docs (`mkdocs build` into a temporary folder) and saves
the first screen of each page a reader opens (what they see before scrolling), as OUT_DIR/PAGE.png; `README` is
the README as a code host renders it (Markdown with tables and fenced code, GitHub's 980-pixel column).
Needs chromium and chromium-driver (apt) and selenium (the dev extra).
"""

from __future__ import annotations

import argparse
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = "A man in a blue shirt is standing on a ladder. Two dogs are playing in the snow."


@contextmanager
def chromium(width: int, height: int):
    from selenium import webdriver

    binary, driver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (binary and driver):
        sys.exit("no chromium and chromedriver: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                 "--hide-scrollbars", f"--window-size={width},{height}"):  # fmt: skip
        options.add_argument(flag)
    browser = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver), options=options)
    try:
        yield browser
    finally:
        browser.quit()


@contextmanager
def serving(run_dir: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "serve.py", f"checkpoint={run_dir}", f"port={port}"], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None:
                    sys.exit(f"serve.py did not start: {server.stderr.read()[-1000:]}")
                time.sleep(0.25)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def serve_page(run_dir: Path, out: Path, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with serving(run_dir) as url, chromium(1000, 700) as browser:
        browser.get(url)
        wait = WebDriverWait(browser, 60)
        wait.until(lambda d: d.find_element(By.ID, "model").text or None)
        browser.find_element(By.ID, "src").send_keys(text)
        browser.find_element(By.ID, "go").click()
        wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#out > li") or None)
        out.parent.mkdir(parents=True, exist_ok=True)
        browser.save_screenshot(str(out))
    print(f"{out}: the page of serve.py with {run_dir}")


README_STYLE = """body { max-width: 980px; margin: 32px auto; padding: 0 32px; font: 16px/1.5 -apple-system, "Segoe UI",
Helvetica, Arial, sans-serif; color: #1f2328 } pre, code { background: #f6f8fa; font-size: 85%; border-radius: 6px }
pre { padding: 16px; overflow: auto } table { border-collapse: collapse } td, th { border: 1px solid #d1d9e0;
padding: 6px 13px } h1, h2 { border-bottom: 1px solid #d1d9e0; padding-bottom: .3em }"""


def readme_html(built: Path) -> Path:
    """README.md as a code host shows it: its Markdown with tables and fenced code, in a 980-pixel column."""
    import markdown

    body = markdown.markdown((ROOT / "README.md").read_text(encoding="utf-8"), extensions=["tables", "fenced_code"])
    page = built / "README.html"
    page.write_text(f"<!doctype html><meta charset=utf-8><style>{README_STYLE}</style>{body}", encoding="utf-8")
    return page


def site(out: Path, pages: list[str]) -> None:
    with tempfile.TemporaryDirectory() as built, chromium(1280, 900) as browser:
        subprocess.run(["mkdocs", "build", "-q", "-d", built], cwd=ROOT, check=True)
        out.mkdir(parents=True, exist_ok=True)
        for page in pages:
            html = Path(built) / ("index.html" if page == "index" else f"{page}/index.html")
            if page == "README":
                html = readme_html(Path(built))
            if not html.is_file():
                sys.exit(f"--pages {page}: no such page in the built site ({html.relative_to(built)})")
            browser.get(html.as_uri())
            time.sleep(0.5)  # fonts and the theme's script
            target = out / f"{page.replace('/', '_')}.png"
            browser.save_screenshot(str(target))
            print(target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("serve", help="the server's page with a translation")
    s.add_argument("run_dir", type=Path)
    s.add_argument("out", type=Path)
    s.add_argument("--text", default=TEXT)
    w = sub.add_parser("site", help="the first screen of docs pages")
    w.add_argument("out", type=Path)
    w.add_argument("--pages", nargs="+", default=["README", "index", "auto", "concepts", "results"])
    args = ap.parse_args()
    if args.what == "serve":
        serve_page(args.run_dir.resolve(), args.out, args.text)
    else:
        site(args.out, args.pages)


if __name__ == "__main__":
    main()
