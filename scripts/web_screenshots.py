"""Take the README's screenshots of the playground and the dashboard, in light and dark schemes.

Starts `surge serve` (bundled model, CPU) on a free port with a small KV pool and a low
``--max-num-seqs`` so that the dashboard shows waiting requests and preemptions, chats in the
playground, has the model call a tool there (a forced call: ``tool_choice`` names the function)
and answers it, puts the server under a changing load while the dashboard records it, and writes
``docs/images/{playground,playground-tools,dashboard}-{light,dark}.png`` (palette PNGs, well
under 200 KB).

Usage (needs a system Chromium and the test extras): ``.venv/bin/python scripts/web_screenshots.py``
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
from PIL import Image
from playwright.sync_api import Page, sync_playwright

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "surge.cli", "serve", "--device", "cpu", "--port", str(port)]
    cmd += ["--max-num-seqs", "6", "--num-kv-blocks", "60", "--served-model-name", "stories260K"]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"surge serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise SystemExit("surge serve did not start")


def _load(base: str, seconds: float) -> None:
    """A changing load: concurrency steps 2 -> 8 -> 4 -> 10 -> 3, prompts shared in part."""
    prompts = ["Once upon a time", "The little dog", "One day, Lily went", "Tom and his mom"]
    end = time.monotonic() + seconds
    steps = [2, 8, 4, 10, 3]

    def worker(i: int, level: int) -> None:
        n = 0
        while time.monotonic() < end and current[0] >= level:
            body = {
                "model": "stories260K",
                "prompt": prompts[(i + n) % len(prompts)] * 3,
                "max_tokens": 150 + 40 * (i % 3),
                "ignore_eos": True,
                "stream": True,
            }
            with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
                for _ in r.iter_lines():
                    pass
            n += 1

    current = [0]
    workers: dict[int, threading.Thread] = {}
    for k, level in enumerate(steps):
        current[0] = level
        for i in range(level):
            if i not in workers or not workers[i].is_alive():
                workers[i] = threading.Thread(target=worker, args=(i, i + 1), daemon=True)
                workers[i].start()
        time.sleep(seconds / len(steps) if k < len(steps) - 1 else max(0.0, end - time.monotonic()))
    current[0] = 0


def _chat(page: Page, base: str) -> None:
    page.goto(base + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.fill("#system", "You are a storyteller for children.")
    page.fill("#seed", "3")
    page.fill("#max_tokens", "90")
    for prompt in ("Tell me a story about a cat who wants to fly.", "What happened next?"):
        page.fill("#prompt", prompt)
        page.click("#send")
        page.wait_for_function(
            "[...document.querySelectorAll('.msg.assistant')].pop()?.dataset.state === 'done'"
        )
        page.wait_for_timeout(200)


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Lyon", "Nice"]}, "unit": {"enum": ["C", "F"]}},
            "required": ["city", "unit"],
        },
    },
}


def _warm_up_tool_call(base: str) -> None:
    """One forced get_weather call before the screenshots: the first compiles the tools' grammar
    (seconds on CPU), which the screenshot's TTFT would show."""
    body = {
        "model": "stories260K",
        "messages": [{"role": "user", "content": "Weather?"}],
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 30,
    }
    httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120).raise_for_status()


def _tool_call(page: Page) -> None:
    """A new chat in which the model calls get_weather (forced), the call's result is added and
    the model answers it; the sidebar scrolled to the Tools boxes."""
    page.click("#new-chat")
    page.fill("#tools", json.dumps([WEATHER]))
    page.fill("#tool_choice", "get_weather")
    page.fill("#max_tokens", "40")
    page.fill("#prompt", "What is the weather like in Paris today?")
    page.click("#send")
    page.wait_for_function("[...document.querySelectorAll('.msg.assistant')].pop()?.dataset.state === 'done'")
    page.fill(".tool-result textarea", '{"temperature": 21, "sky": "sunny"}')
    page.click(".tool-result button")
    page.fill("#tool_choice", "none")
    page.click("#send")
    page.wait_for_function("[...document.querySelectorAll('.msg.assistant')].pop()?.dataset.state === 'done'")
    page.eval_on_selector("#sidebar", "el => { el.scrollTop = el.scrollHeight; }")
    page.eval_on_selector("#tools", "el => { el.scrollTop = 0; }")
    page.wait_for_timeout(200)


def _save(page: Page, path: Path) -> None:
    page.screenshot(path=str(path))
    Image.open(path).convert("RGB").quantize(colors=128, method=Image.Quantize.MEDIANCUT).save(
        path, optimize=True
    )
    print(f"{path.relative_to(REPO)}: {path.stat().st_size // 1024} KB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--load-seconds", type=float, default=75.0)
    parser.add_argument("--port", type=int, default=None, help="the server's port (default: a free one)")
    args = parser.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("needs a system Chromium (apt-get install chromium)")
    args.out.mkdir(parents=True, exist_ok=True)
    port = args.port or _free_port()
    base = f"http://127.0.0.1:{port}"
    server = _start_server(port, args.out.parent / "web_screenshots_server.log")
    try:
        _warm_up_tool_call(base)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            contexts = {
                scheme: browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
                for scheme in ("light", "dark")
            }
            pages = {scheme: ctx.new_page() for scheme, ctx in contexts.items()}
            for scheme, page in pages.items():
                _chat(page, base)
                _save(page, args.out / f"playground-{scheme}.png")
                _tool_call(page)
                _save(page, args.out / f"playground-tools-{scheme}.png")
                page.goto(base + "/dashboard")
            load = threading.Thread(target=_load, args=(base, args.load_seconds))
            load.start()
            time.sleep(args.load_seconds - 4)  # while the last, light step still runs
            for scheme, page in pages.items():
                _save(page, args.out / f"dashboard-{scheme}.png")
            load.join()
            browser.close()
    finally:
        server.terminate()
        server.wait(30)
        (args.out.parent / "web_screenshots_server.log").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
