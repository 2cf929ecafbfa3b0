"""The course as learners meet it: a real JupyterLab in headless Chromium runs every chapter.

Starts `jupyter lab` on 127.0.0.1 (free port, random token: auth stays on) over a copy of the
notebooks, opens each chapter, runs all cells through the Run menu, waits for every cell to finish,
and asserts that no cell shows an error. In chapter 1 it drags the learning-rate slider and checks
the plot changes. Screenshots land in test-artifacts/browser/. The server and every kernel are shut
down afterwards, also when a test fails, and the test checks that no process is left.

Needs Debian's `chromium` (the `./course test` command installs it where it can) and the `playwright`
package (a pinned dependency; its own browser download is never used).
"""
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = ROOT / "test-artifacts" / "browser"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(CHROMIUM is None, reason="Chromium not found: `apt-get install chromium` (./course test "
                                                "does it when run as root on Debian/Ubuntu), then rerun"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A running JupyterLab over a copy of the notebooks: yields (base_url, token)."""
    workdir = tmp_path_factory.mktemp("lab")
    for notebook in NOTEBOOKS:
        shutil.copy(notebook, workdir)
    # a private settings and workspace folder: no news prompt over the screenshots, nothing written to ~/.jupyter
    config = tmp_path_factory.mktemp("lab-config")
    settings = config / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    port, token = _free_port(), secrets.token_hex(16)
    log = open(workdir / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={workdir}",
         "--LabApp.expose_app_in_browser=True", f"--LabApp.user_settings_dir={config / 'settings'}",
         f"--LabApp.workspaces_dir={config / 'workspaces'}", *(["--allow-root"] if os.geteuid() == 0 else [])],
        stdout=log, stderr=subprocess.STDOUT, cwd=workdir)
    base = f"http://127.0.0.1:{port}"
    family: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while _get(f"{base}/api/status?token={token}") != 200:
            assert server.poll() is None, (workdir / "server.log").read_text()
            assert time.monotonic() < deadline, "JupyterLab did not start within 90 s"
            time.sleep(0.5)
        assert _get(f"{base}/api/status") == 403, "token auth must stay on"
        yield base, token, family
    finally:
        if server.poll() is None:
            family += psutil.Process(server.pid).children(recursive=True)   # kernels and their workers
        request = urllib.request.Request(f"{base}/api/shutdown?token={token}", method="POST")
        try:
            urllib.request.urlopen(request, timeout=10)
        except OSError:
            pass
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        gone, alive = psutil.wait_procs([p for p in family if p.is_running()], timeout=15)
        for process in alive:
            process.kill()
        log.close()
        assert not alive, f"processes left behind after shutdown: {[p.pid for p in alive]}"


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        try:
            yield chromium
        finally:
            chromium.close()


CELL_STATE = """() => {
  const panel = window.jupyterapp.shell.currentWidget;
  if (!panel || !panel.content || !panel.sessionContext) return null;
  const cells = panel.content.widgets.filter(c => c.model.type === 'code');
  return {
    kernel: panel.sessionContext.kernelDisplayStatus,
    total: cells.length,
    done: cells.filter(c => c.model.executionCount !== null).length,
    errors: cells.flatMap((c, i) => c.model.outputs.toJSON()
        .filter(o => o.output_type === 'error')
        .map(o => `code cell ${i}: ${o.ename}: ${o.evalue}`)),
  };
}"""


def run_all_through_the_ui(page, base: str, token: str, name: str, timeout_s: float = 600):
    page.goto(f"{base}/lab/tree/{name}?reset&token={token}")    # reset: a fresh workspace, only this notebook
    page.wait_for_function("""(name) => {
        const panel = window.jupyterapp?.shell.currentWidget;
        return panel?.context?.path === name && panel.sessionContext?.kernelDisplayStatus === 'idle';
    }""", arg=name, timeout=120_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    deadline = time.monotonic() + timeout_s
    state = None
    while time.monotonic() < deadline:
        state = page.evaluate(CELL_STATE)
        if state and state["done"] == state["total"] and state["kernel"] == "idle":
            return state
        if state and state["errors"]:
            return state          # Run All stops at the first error
        time.sleep(1)
    raise AssertionError(f"{name} did not finish within {timeout_s} s: {state}")


@pytest.mark.parametrize("notebook", [n.name for n in NOTEBOOKS])
def test_run_all_in_jupyterlab(lab, browser, notebook):
    base, token, _ = lab
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        state = run_all_through_the_ui(page, base, token, notebook)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"{Path(notebook).stem}.png"), full_page=False)
        assert state["errors"] == [], f"{notebook} shows errors: {state['errors']}"
        assert state["done"] == state["total"] > 0
    finally:
        page.close()


def _plot_fingerprint(page) -> str:
    image = page.locator(".widget-output img").first.get_attribute("src") or ""
    return hashlib.sha256(image.encode()).hexdigest()


def test_chapter1_learning_rate_slider_redraws_the_plot(lab, browser):
    base, token, _ = lab
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        state = run_all_through_the_ui(page, base, token, "01_tensors_autograd.ipynb")
        assert state["errors"] == []
        slider = page.locator(".widget-hslider", has_text="learning rate").first
        slider.scroll_into_view_if_needed()
        slider.locator(".noUi-handle").first.wait_for(timeout=30_000)    # a real slider, rendered
        readout = slider.locator(".widget-readout")
        before_value, before_plot = readout.inner_text(), _plot_fingerprint(page)
        assert before_plot != hashlib.sha256(b"").hexdigest(), "the widget shows no plot"
        handle = slider.locator(".noUi-handle").first
        for _ in range(3):    # the notebook may still re-lay out (images loading) between measuring and dragging
            slider.scroll_into_view_if_needed()
            box = handle.bounding_box()
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.mouse.move(box["x"] + 200, box["y"] + box["height"] / 2, steps=10)   # drag to a larger rate
            page.mouse.up()
            moved = time.monotonic() + 5
            while readout.inner_text() == before_value and time.monotonic() < moved:
                time.sleep(0.25)
            if readout.inner_text() != before_value:
                break
        deadline = time.monotonic() + 30
        while _plot_fingerprint(page) == before_plot and time.monotonic() < deadline:
            time.sleep(0.5)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        slider.screenshot(path=str(ARTIFACTS / "01_slider_moved.png"))
        page.locator(".widget-output").first.screenshot(path=str(ARTIFACTS / "01_widget_plot_after.png"))
        assert readout.inner_text() != before_value, "the slider did not move"
        assert _plot_fingerprint(page) != before_plot, "moving the slider did not redraw the plot"
    finally:
        page.close()
