"""The playground and the dashboard in a real headless Chromium, against `surge serve` (bundled model, CPU)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import REPO, Server, start_server

pytestmark = pytest.mark.browser

LAST = "() => [...document.querySelectorAll('.msg.assistant')].pop()"


def metric(srv: Server, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` (matching ``labels``) on the server's /metrics."""
    total = 0.0
    for family in text_string_to_metric_families(httpx.get(srv.url + "/metrics").text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def open_playground(page: Any, srv: Server) -> None:
    page.goto(srv.url + "/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")


def set_range(page: Any, selector: str, value: float) -> None:
    page.eval_on_selector(
        selector, "(el, v) => { el.value = v; el.dispatchEvent(new Event('input')); }", str(value)
    )


def last_message(page: Any) -> dict[str, Any]:
    """State, text and stats of the newest assistant message."""
    return page.evaluate(
        f"""() => {{
        const m = ({LAST})();
        const stat = (k) => m.querySelector(`[data-stat=${{k}}] b`).textContent;
        return {{state: m.dataset.state, events: Number(m.dataset.events || 0),
                 text: m.querySelector('.body').textContent,
                 tokens: stat('tokens'), tps: stat('tps'), ttft: stat('ttft'), finish: stat('finish')}};
    }}"""
    )


def wait_finished(page: Any) -> dict[str, Any]:
    page.wait_for_function(f"() => ({LAST})().dataset.state !== 'streaming'")
    return last_message(page)


def test_chat_streams_then_shows_stats(page: Any, web_server: Server) -> None:
    open_playground(page, web_server)
    page.fill("#max_tokens", "400")
    page.check("#ignore_eos")
    page.fill("#prompt", "Tell me a story about a dog.")
    page.click("#send")
    page.wait_for_selector(".msg.assistant")
    seen: list[int] = []
    while True:  # sample the text while it streams
        m = last_message(page)
        if m["state"] != "streaming":
            break
        seen.append(len(m["text"]))
        time.sleep(0.01)
    grew = sorted({n for n in seen if n > 0})
    assert len(grew) >= 2, f"the text did not grow while streaming: {seen}"
    assert m["state"] == "done"
    assert len(m["text"]) > max(grew[:-1])
    assert m["tokens"] == "400"
    assert m["finish"] == "length"
    assert float(m["tps"]) > 0
    assert m["ttft"].endswith(" ms")
    assert page.locator(".msg.user .body").first.text_content() == "Tell me a story about a dog."


def test_stop_mid_stream_aborts_the_request(page: Any, web_server: Server) -> None:
    open_playground(page, web_server)
    page.click("#mode [data-mode=completion]")
    page.fill("#max_tokens", "500")
    page.check("#ignore_eos")
    page.fill("#prompt", "Once upon a time")
    generated_before = metric(web_server, "surge:generation_tokens_total")
    page.click("#send")
    page.wait_for_function(f"() => Number(({LAST})().dataset.events || 0) >= 3")
    page.click("#stop-btn")
    m = wait_finished(page)
    assert m["state"] == "stopped"
    assert m["finish"] == "stopped"
    assert 3 <= int(m["tokens"]) < 500
    assert page.locator("#send").is_visible() and not page.locator("#stop-btn").is_visible()
    deadline = time.monotonic() + 15
    while metric(web_server, "surge:num_requests_running") != 0:
        assert time.monotonic() < deadline, "the stopped request is still running"
        time.sleep(0.1)
    generated = metric(web_server, "surge:generation_tokens_total") - generated_before
    time.sleep(0.5)
    assert metric(web_server, "surge:generation_tokens_total") - generated_before == generated
    assert generated < 500, "the server generated the whole answer: it did not see the disconnect"


def test_max_tokens_5(page: Any, web_server: Server) -> None:
    open_playground(page, web_server)
    page.fill("#max_tokens", "5")
    page.check("#ignore_eos")
    page.fill("#prompt", "Hello")
    page.keyboard.press("Enter")
    m = wait_finished(page)
    assert m["state"] == "done"
    assert m["tokens"] == "5"  # usage.completion_tokens
    assert 1 <= m["events"] <= 5
    assert m["finish"] == "length"


def test_max_tokens_auto_by_default(page: Any, web_server: Server) -> None:
    """An empty max tokens ("auto") asks for all the room left: chat leaves max_tokens out,
    completions send the room /tokenize counts (their default is 16, and so is null, as in
    vLLM 0.26). A chat whose prompt is over half the bundled model's 512-token context then
    still gets an answer (a fixed default of 256 was a 400)."""
    open_playground(page, web_server)
    assert page.input_value("#max_tokens") == ""
    assert page.get_attribute("#max_tokens", "placeholder") == "auto"
    page.check("#ignore_eos")
    page.fill("#prompt", " ".join(["Tom had a big red ball and he liked to play with it."] * 25))
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert "max_tokens" not in req.value.post_data_json
    # untouched sliders and an empty top k leave the model's defaults (generation_config) to the server
    assert not {"temperature", "top_p", "top_k"} & req.value.post_data_json.keys()
    assert page.inner_text("#temperature-value") == "model default"
    m = wait_finished(page)
    assert page.locator(".msg.error").count() == 0
    assert m["state"] == "done" and m["finish"] == "length", m
    assert 1 <= int(m["tokens"]) < 256
    page.once("dialog", lambda d: d.accept())  # the chat above is cleared
    page.click("#mode [data-mode=completion]")
    page.fill("#prompt", "Once upon a time")
    with page.expect_request("**/v1/completions") as req:
        page.click("#send")
    counted = httpx.post(web_server.url + "/tokenize", json={"prompt": "Once upon a time"}, timeout=60).json()
    assert req.value.post_data_json["max_tokens"] == counted["max_model_len"] - counted["count"]
    m = wait_finished(page)
    assert m["state"] == "done" and m["finish"] == "length" and int(m["tokens"]) > 16, m


def test_completion_ttft_is_timed_from_the_completion_request(page: Any, web_server: Server) -> None:
    """Max tokens "auto" on completions asks /tokenize for the room left before sending the
    completion: the TTFT shown is timed from the completion request, not from the click (a slow
    /tokenize answer, held 2 s here, was counted as time to the first token)."""
    open_playground(page, web_server)
    page.click("#mode [data-mode=completion]")
    held: list[Any] = []
    page.route("**/tokenize", lambda route: held.append(route))
    page.fill("#prompt", "Once upon a time")
    page.click("#send")
    _hold(page, held)
    page.wait_for_timeout(2000)
    held[0].continue_()
    m = wait_finished(page)
    assert m["state"] == "done" and m["ttft"].endswith(" ms"), m
    assert int(m["ttft"].removesuffix(" ms")) < 1500, m


def test_settings_history_new_chat_and_completion_mode(page: Any, web_server: Server) -> None:
    open_playground(page, web_server)
    page.fill("#system", "You tell short stories.")
    set_range(page, "#temperature", 0.5)
    set_range(page, "#top_p", 0.9)
    page.fill("#top_k", "20")
    page.fill("#seed", "7")
    page.fill("#max_tokens", "8")
    page.fill("#stop", "The end\nSTOP")
    page.select_option("#thinking", "off")
    page.fill("#prompt", "first question")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    body = req.value.post_data_json
    assert body["model"] == page.eval_on_selector("#model", "el => el.value")
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0.5 and body["top_p"] == 0.9
    assert page.inner_text("#temperature-value") == "0.50"
    assert body["top_k"] == 20 and body["seed"] == 7 and body["max_tokens"] == 8
    assert body["stop"] == ["The end", "STOP"]
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "ignore_eos" not in body
    assert body["messages"] == [
        {"role": "system", "content": "You tell short stories."},
        {"role": "user", "content": "first question"},
    ]
    first = wait_finished(page)
    assert first["state"] == "done", first
    page.fill("#prompt", "second question")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    roles = [(m["role"], m["content"]) for m in req.value.post_data_json["messages"]]
    assert roles == [
        ("system", "You tell short stories."),
        ("user", "first question"),
        ("assistant", first["text"]),
        ("user", "second question"),
    ]
    wait_finished(page)
    page.click("#new-chat")
    assert page.locator(".msg").count() == 0 and page.locator("#empty").is_visible()
    page.fill("#prompt", "third")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert [m["role"] for m in req.value.post_data_json["messages"]] == ["system", "user"]
    wait_finished(page)

    page.once("dialog", lambda d: d.accept())  # "third" and its answer are cleared
    page.click("#mode [data-mode=completion]")
    assert not page.locator("#system").is_visible()
    page.fill("#prompt", "Once upon a time")
    with page.expect_request("**/v1/completions") as req:
        page.click("#send")
    body = req.value.post_data_json
    assert body["prompt"] == "Once upon a time" and "messages" not in body
    assert "chat_template_kwargs" not in body
    m = wait_finished(page)
    assert m["state"] == "done" and m["text"] and int(m["tokens"]) >= 1


def _sse(chunks: list[dict[str, Any]]) -> str:
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def test_model_output_is_never_html(page: Any, web_server: Server) -> None:
    """Markup in the prompt, the answer and the reasoning shows as text; nothing in it runs."""
    open_playground(page, web_server)
    # The escaping function itself, on a hostile string.
    kinds = page.evaluate(
        """() => { const d = document.createElement('div');
        SurgeCommon.renderText(d, 'a <img src=x onerror="window.__pwned=1"> `<b>x</b>` ```\\n<script>window.__pwned=1</script>\\n``` z');
        return [d.textContent, [...d.querySelectorAll('*')].map(e => e.tagName)]; }"""
    )
    assert kinds[0] == 'a <img src=x onerror="window.__pwned=1"> <b>x</b> <script>window.__pwned=1</script> z'
    assert kinds[1] == ["CODE", "PRE", "CODE"]

    # A whole answer through the page's real streaming path, from a hostile "model".
    def delta(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    answer = [
        'Hi <img src=x onerror="window.__pwned=2">',
        " <script>window.__pwned=3</script>",
        '\n```html\n<iframe src="javascript:window.__pwned=4"></iframe>\n```\n',
        "<b>bold?</b>",
    ]
    chunks = [delta({"role": "assistant", "reasoning_content": "I think <i>hard</i>."})]
    chunks += [delta({"content": a}) for a in answer[:-1]] + [delta({"content": answer[-1]}, "stop")]
    chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}})
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_sse(chunks)
        ),
    )
    prompt = '<img src=y onerror="window.__pwned=5"><script>window.__pwned=6</script>'
    page.fill("#prompt", prompt)
    page.click("#send")
    m = wait_finished(page)
    assert m["state"] == "done"
    assert m["text"] == (
        'Hi <img src=x onerror="window.__pwned=2"> <script>window.__pwned=3</script>'
        '<iframe src="javascript:window.__pwned=4"></iframe><b>bold?</b>'
    )
    assert m["tokens"] == "7" and m["finish"] == "stop"
    assert page.evaluate("window.__pwned") is None
    tags = page.evaluate(
        "[...document.querySelectorAll('#messages .body *, #messages .reasoning-text *')].map(e => e.tagName)"
    )
    assert set(tags) == {"PRE", "CODE"}
    assert page.locator("#messages img, #messages script, #messages iframe").count() == 0
    assert page.locator(".msg.user .body").text_content() == prompt
    assert "<iframe" in page.locator(".msg.assistant pre code").text_content()
    reasoning = page.locator(".msg.assistant details.reasoning")
    assert reasoning.is_visible() and reasoning.get_attribute("open") is None  # folded
    assert "Reasoning" in reasoning.locator("summary").text_content()
    assert reasoning.locator(".reasoning-text").text_content() == "I think <i>hard</i>."


def test_errors_show_the_server_message(page: Any, web_server: Server) -> None:
    open_playground(page, web_server)
    page.fill("#max_tokens", "100000")
    page.fill("#prompt", "Hello")
    page.click("#send")
    page.wait_for_selector(".msg.error")
    assert "400" in page.locator(".msg.error .body").text_content()
    assert page.locator(".msg.assistant").count() == 0
    assert page.locator("#send").is_visible()


def test_dashboard_updates_during_a_benchmark(page: Any, web_server: Server, tmp_path: Path) -> None:
    page.goto(web_server.url + "/dashboard")
    page.wait_for_function("window.surgeDashboard && window.surgeDashboard.samples >= 2")
    canvas = "document.querySelector('[data-chart=gen] canvas').toDataURL()"
    before = page.evaluate(canvas)
    bench = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "surge.cli",
            "bench",
            "serve",
            "--base-url",
            web_server.url,
            "--input-len",
            "32",
            "--output-len",
            "256",  # about 4 s on a CPU: the dashboard samples once a second, a shorter run can fall between two
            "--num-prompts",
            "32",
            "--max-concurrency",
            "4",
            "--ignore-eos",
            "--disable-tqdm",
            "--result-file",
            str(tmp_path / "bench.json"),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        page.wait_for_function(
            "window.surgeDashboard.history.some(s => s.running > 0 && s.gen_tps > 0)", timeout=90_000
        )
        page.wait_for_function("window.surgeDashboard.history.some(s => s.ttft_p50 > 0 && s.itl_p50 > 0)")
        out, _ = bench.communicate(timeout=120)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    assert bench.returncode == 0, out.decode(errors="replace")[-2000:]
    assert json.loads((tmp_path / "bench.json").read_text())["completed"] == 32
    page.wait_for_function("window.surgeDashboard.history.some(s => s.prompt_tps > 0)")
    samples = page.evaluate("window.surgeDashboard.samples")
    page.wait_for_function(f"window.surgeDashboard.samples >= {samples + 1}")  # still refreshing
    assert page.evaluate(canvas) != before
    assert page.evaluate("window.surgeDashboard.errors") == 0
    finished = page.locator("[data-tile=finished] .v").text_content()
    assert int(finished) >= 32
    page.wait_for_function("window.surgeDashboard.latest.running === 0")
    assert page.locator("[data-tile=running] .v").text_content() == "0"


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_colour_schemes(browser: Any, web_server: Server, scheme: str, tmp_path: Path) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800}, color_scheme=scheme)
    try:
        page = context.new_page()
        backgrounds = {}
        for path in ("/", "/dashboard"):
            page.goto(web_server.url + path)
            page.wait_for_function("document.getElementById('health-label').textContent === 'Ready'")
            backgrounds[path] = page.evaluate("getComputedStyle(document.body).backgroundColor")
            shot = tmp_path / f"{scheme}{path.replace('/', '-')}.png"
            page.screenshot(path=str(shot))
            assert shot.stat().st_size > 5000
        expected = "rgb(246, 247, 249)" if scheme == "light" else "rgb(15, 17, 21)"
        assert set(backgrounds.values()) == {expected}
    finally:
        context.close()


def test_api_key_kept_in_session_storage(page: Any, tmp_path: Path) -> None:
    srv = start_server(tmp_path, "--api-key", "sekret")
    try:
        page.goto(srv.url + "/")
        page.wait_for_selector("#key-field", state="visible")
        assert "needs an API key" in page.locator("#key-notice").text_content()
        # styled as the other fields' labels: its hint apart, not one run-on "API key kept for this tab only"
        label_style = "sel => getComputedStyle(document.querySelector(sel)).display"
        assert page.evaluate(label_style, "#key-field .label") == page.evaluate(
            label_style, "#system-field .label"
        )
        assert page.evaluate(label_style, "#key-field .label") == "flex"
        assert page.locator("#model option").count() == 0
        page.fill("#api-key", "wrong")
        page.wait_for_function("document.getElementById('key-notice').textContent.includes('refused')")
        page.fill("#api-key", "sekret")
        page.wait_for_function("document.querySelector('#model').options.length > 0")
        assert not page.locator("#key-notice").is_visible()
        page.fill("#max_tokens", "3")
        page.fill("#prompt", "Hi")
        page.click("#send")
        assert wait_finished(page)["state"] == "done"
        storage = page.evaluate(
            "[sessionStorage.getItem('surge.apiKey'), Object.keys(localStorage), document.cookie]"
        )
        assert storage == ["sekret", ["surge.settings"], ""]  # local storage: the settings only
        assert "sekret" not in page.evaluate("localStorage.getItem('surge.settings')")
        page.reload()  # the same tab keeps it
        page.wait_for_function("document.querySelector('#model').options.length > 0")
        assert page.input_value("#api-key") == "sekret"
    finally:
        assert srv.stop() == 0


def test_dashboard_reads_vllm_metric_names(page: Any, tmp_path: Path) -> None:
    """Under ``--metrics-prefix vllm`` every metric vLLM has is ``vllm:*`` (Surge's own, such as
    ``surge:engine_up``, keep ``surge:``): the dashboard finds its series under that prefix (it
    read ``surge:*`` only)."""
    srv = start_server(tmp_path, "--metrics-prefix", "vllm")
    try:
        for _ in range(3):
            body = {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True}
            assert httpx.post(srv.url + "/v1/completions", json=body, timeout=60).status_code == 200
        page.goto(srv.url + "/dashboard")
        page.wait_for_function("window.surgeDashboard && window.surgeDashboard.samples >= 2")
        page.wait_for_function("document.querySelector('[data-tile=finished] .v').textContent === '3'")
        assert page.evaluate("window.surgeDashboard.errors") == 0
    finally:
        assert srv.stop() == 0, srv.log()[-3000:]


def test_a_server_that_goes_away_is_said_in_words(page: Any, web_server: Server) -> None:
    """A stream cut before ``[DONE]`` (the server died or a proxy closed it) is an error, not a
    finished answer; a server that cannot be reached gets a sentence instead of the browser's
    bare "Failed to fetch"."""
    open_playground(page, web_server)
    delta = {"choices": [{"index": 0, "delta": {"content": "Once upon"}, "finish_reason": None}]}
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=f"data: {json.dumps(delta)}\n\n"
        ),
    )
    page.fill("#prompt", "Tell me a story")
    page.click("#send")
    m = wait_finished(page)
    assert m["state"] == "error" and m["text"] == "Once upon", m  # the part that came stays
    error = page.locator(".msg.error .body").text_content()
    assert "connection to the server was lost before the end of the answer" in error, error
    assert "[DONE]" in error

    page.unroute("**/v1/chat/completions")
    page.route("**/v1/chat/completions", lambda route: route.abort("connectionrefused"))
    page.fill("#prompt", "Hello?")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('.msg.error').length === 2")
    error = page.locator(".msg.error .body").nth(1).text_content()
    assert error.startswith(f"Cannot reach the server at {web_server.url} (")
    assert error.endswith("is it running?")
    assert page.locator("#send").is_visible()


def test_a_setting_that_is_not_a_whole_number_is_refused(page: Any, web_server: Server) -> None:
    """Seed, top k and max tokens that are not whole numbers stop the send with a message that
    names the field (they were left out of the request without a word: 3.5 max tokens became
    "auto", a 1.5 seed a random one)."""
    open_playground(page, web_server)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/chat/completions" in r.url else None)
    page.fill("#prompt", "Hello")
    for field, value, label in [("#seed", "1.5", "Seed"), ("#max_tokens", "3.5", "Max tokens")]:
        page.fill(field, value)
        page.click("#send")
        error = page.locator(".msg.error .body").last
        error.wait_for()
        assert (
            error.text_content() == f"{label} must be a whole number, not {value} (or empty for the default)."
        )
        assert page.evaluate("document.activeElement.id") == field[1:]
        assert page.get_attribute(field, "aria-invalid") == "true"
        page.fill(field, "")
        assert page.get_attribute(field, "aria-invalid") is None
        page.click("#new-chat")
    page.focus("#top_k")
    page.keyboard.type("1e")  # the browser's value is "" for text that is not a number
    page.click("#send")
    page.locator(".msg.error").wait_for()
    assert (
        page.locator(".msg.error .body").text_content()
        == "Top k must be a whole number (or empty for the default)."
    )
    assert sent == [] and page.locator(".msg.user").count() == 0
    assert page.input_value("#prompt") == "Hello"
    page.fill("#top_k", "")
    page.fill("#seed", "7")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert req.value.post_data_json["seed"] == 7 and "top_k" not in req.value.post_data_json
    assert wait_finished(page)["state"] == "done"


def test_phone_width(browser: Any, web_server: Server) -> None:
    """At 375 px neither page scrolls sideways (the top bar was 406 px wide), and the playground
    shows the chat and its composer on the first screen (the whole settings panel came first):
    the settings fold open from a Settings button."""
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(web_server.url + "/dashboard")
        page.wait_for_function("window.surgeDashboard && window.surgeDashboard.samples >= 1")
        assert page.evaluate("document.documentElement.scrollWidth") == 375
        open_playground(page, web_server)
        assert page.evaluate("document.documentElement.scrollWidth") == 375
        assert page.locator("#health-label").is_visible()
        send = page.locator("#send").bounding_box()
        assert send is not None and send["y"] + send["height"] <= 740  # no scrolling to reach it
        assert page.evaluate("window.scrollY") == 0
        toggle = page.locator("#settings-toggle")
        assert (
            not page.locator("#temperature").is_visible() and toggle.get_attribute("aria-expanded") == "false"
        )
        toggle.click()
        assert page.locator("#temperature").is_visible() and toggle.get_attribute("aria-expanded") == "true"
        page.fill("#max_tokens", "5")
        toggle.click()
        assert not page.locator("#temperature").is_visible()
        page.fill("#prompt", "Hello")
        page.click("#send")
        m = wait_finished(page)
        assert m["state"] == "done" and m["tokens"] == "5", m
    finally:
        context.close()


def test_right_to_left_text(page: Any, web_server: Server) -> None:
    """Arabic or Hebrew reads right to left in the prompt box, the messages and the reasoning
    (every message was left to right: "مرحبا!" showed its "!" on the wrong side); English stays
    left to right and code stays left to right inside a right-to-left answer."""
    open_playground(page, web_server)
    rtl = "(sel) => [...document.querySelectorAll(sel)].map(e => getComputedStyle(e).direction)"

    def chunk(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    answers = [
        [
            chunk({"reasoning_content": "أفكر"}),
            chunk({"content": "مرحبا!\n```\nprint(1)\n```\nشكرا."}, "stop"),
        ],
        [chunk({"content": "Hello!"}, "stop")],
    ]
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_sse(answers.pop(0))
        ),
    )
    page.fill("#prompt", "كيف حالك؟")
    assert page.evaluate(rtl, "#prompt") == ["rtl"]
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    page.fill("#prompt", "How are you?")
    assert page.evaluate(rtl, "#prompt") == ["ltr"]
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    assert page.evaluate(rtl, ".msg.user .body") == ["rtl", "ltr"]
    assert page.evaluate(rtl, ".msg.assistant .body") == ["rtl", "ltr"]
    assert page.evaluate(rtl, ".msg.assistant .reasoning-text") == ["rtl", "ltr"]
    assert page.evaluate(rtl, ".msg.assistant pre") == ["ltr"]


def test_focus_stays_in_the_prompt_box_after_send_and_stop(page: Any, web_server: Server) -> None:
    """Clicking Send or Stop hides that button: its focus goes to the prompt box (it fell to the
    page's body, so the next Enter or keystroke went nowhere)."""
    open_playground(page, web_server)
    focused = "document.activeElement.id"
    page.fill("#max_tokens", "400")
    page.check("#ignore_eos")
    page.fill("#prompt", "Tell me a story")
    page.click("#send")
    page.wait_for_function(f"() => Number(({LAST})().dataset.events || 0) >= 1")
    assert page.evaluate(focused) == "prompt"
    page.click("#stop-btn")
    assert wait_finished(page)["state"] == "stopped"
    assert page.evaluate(focused) == "prompt"
    page.keyboard.type("Again")  # straight into the prompt box
    assert page.input_value("#prompt") == "Again"
    # a short answer, so that the conversation (up to 400 tokens so far) still fits the 512-token
    # context: a refused turn would leave the screen and go back into the prompt box
    page.fill("#max_tokens", "4")
    page.focus("#prompt")
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelectorAll('.msg.user').length === 2")
    assert page.locator(".msg.user .body").last.text_content() == "Again"
    page.wait_for_function("!document.getElementById('send').hidden")
    assert page.locator(".msg.error").count() == 0
    assert page.locator(".msg.user .body").last.text_content() == "Again"


def test_a_stop_string_can_be_a_line_break(page: Any, web_server: Server) -> None:
    """Each line of the stop box is one stop string, so a line break could not be one (vLLM's
    and OpenAI's usual ``stop: ["\\n"]``): ``\\n`` and ``\\t`` in a line are a line break and a
    tab, ``\\\\`` one backslash."""
    open_playground(page, web_server)
    page.click("#mode [data-mode=completion]")
    page.fill("#stop", "\\n\nThe end\\\\n\nEnd\\t")
    page.fill("#seed", "0")
    page.check("#ignore_eos")
    page.fill("#prompt", "Once upon a time")
    with page.expect_request("**/v1/completions") as req:
        page.click("#send")
    assert req.value.post_data_json["stop"] == ["\n", "The end\\n", "End\t"]
    m = wait_finished(page)
    assert m["state"] == "done" and m["finish"] == "stop", m
    assert m["text"] and "\n" not in m["text"]


def test_an_answer_that_ended_while_reasoning_shows_the_reasoning(page: Any, web_server: Server) -> None:
    """A reasoning model cut by max tokens before its answer (Qwen3 with a small max tokens) gets
    its reasoning unfolded instead of an empty answer box under a folded "Reasoning"."""
    open_playground(page, web_server)

    def chunk(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}

    answers = [
        [
            chunk({"role": "assistant", "content": ""}),
            chunk({"reasoning_content": "Let me think."}, "length"),
        ],
        [chunk({"reasoning_content": "Easy."}), chunk({"content": "4"}, "stop")],
    ]
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_sse(answers.pop(0))
        ),
    )
    page.fill("#prompt", "Think hard")
    page.click("#send")
    m = wait_finished(page)
    assert m["state"] == "done" and m["finish"] == "length" and m["text"] == "", m
    reasoning = page.locator(".msg.assistant details.reasoning")
    assert reasoning.get_attribute("open") is not None
    assert reasoning.locator(".reasoning-text").is_visible()
    assert not page.locator(".msg.assistant .body").is_visible()
    page.fill("#prompt", "2+2?")
    page.click("#send")
    m = wait_finished(page)
    assert m["text"] == "4"
    assert reasoning.nth(1).get_attribute("open") is None  # with an answer it stays folded
    assert page.locator(".msg.assistant .body").nth(1).is_visible()
    # the first turn had no answer text: it is not sent again, and the screen marks it so
    assert page.locator(".msg.user.left-out").count() == 1
    assert page.locator(".msg.user").nth(1).get_attribute("class") == "msg user"


def test_a_moved_slider_can_go_back_to_the_model_default(page: Any, web_server: Server) -> None:
    """Temperature and top p are sent only once moved; their reset button leaves them out of the
    request again (once moved, only a reload brought "model default" back)."""
    open_playground(page, web_server)
    assert not page.locator("#temperature-reset").is_visible()
    set_range(page, "#temperature", 1.5)
    set_range(page, "#top_p", 0.5)
    page.fill("#max_tokens", "2")
    page.fill("#prompt", "Hi")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert req.value.post_data_json["temperature"] == 1.5 and req.value.post_data_json["top_p"] == 0.5
    wait_finished(page)
    page.click("#temperature-reset")
    assert page.inner_text("#temperature-value") == "model default"
    assert not page.locator("#temperature-reset").is_visible()
    assert page.inner_text("#top_p-value") == "0.50"
    page.fill("#prompt", "Hi again")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert "temperature" not in req.value.post_data_json and req.value.post_data_json["top_p"] == 0.5
    assert wait_finished(page)["state"] == "done"


def test_dashboard_tiles_go_stale_when_metrics_cannot_be_read(page: Any, web_server: Server) -> None:
    """While /metrics cannot be read the tiles and charts are greyed and a live note says their
    values are stale (they kept their last values looking live, only a banner said so); the next
    good scrape clears it."""
    page.goto(web_server.url + "/dashboard")
    page.wait_for_function("window.surgeDashboard && window.surgeDashboard.samples >= 1")
    assert page.evaluate("document.querySelector('main.dash').classList.contains('stale')") is False
    assert page.get_attribute("#dash-stale", "aria-live") == "polite"
    page.route("**/metrics", lambda route: route.abort("connectionrefused"))
    page.wait_for_function("document.querySelector('main.dash').classList.contains('stale')")
    note = page.locator("#dash-stale").text_content() or ""
    assert note.startswith("The values below are stale: last read at "), note
    assert page.locator("#dash-error").is_visible()
    assert float(page.eval_on_selector("#tiles", "el => getComputedStyle(el).opacity")) < 1
    assert float(page.eval_on_selector("#charts", "el => getComputedStyle(el).opacity")) < 1
    samples = page.evaluate("window.surgeDashboard.samples")
    page.unroute("**/metrics")
    page.wait_for_function(f"window.surgeDashboard.samples > {samples}")
    assert page.evaluate("document.querySelector('main.dash').classList.contains('stale')") is False
    assert page.locator("#dash-stale").text_content() == ""
    assert not page.locator("#dash-error").is_visible()
    assert float(page.eval_on_selector("#tiles", "el => getComputedStyle(el).opacity")) == 1


def test_mode_buttons_say_which_mode_is_on(page: Any, web_server: Server) -> None:
    """The Chat and Completion buttons carry ``aria-pressed`` in step with the mode, in a group
    named Mode (only a CSS class showed the active one: a screen reader could not tell)."""
    open_playground(page, web_server)
    chat = page.get_by_role("button", name="Chat", exact=True, pressed=True)
    completion = page.get_by_role("button", name="Completion", exact=True, pressed=False)
    assert chat.count() == 1 and completion.count() == 1
    assert page.get_by_role("group", name="Mode").count() == 1
    completion.click()
    assert page.get_attribute("#mode [data-mode=completion]", "aria-pressed") == "true"
    assert page.get_attribute("#mode [data-mode=chat]", "aria-pressed") == "false"
    page.click("#mode [data-mode=chat]")
    assert page.get_attribute("#mode [data-mode=chat]", "aria-pressed") == "true"
    assert page.get_attribute("#mode [data-mode=completion]", "aria-pressed") == "false"


def test_phone_width_fits_the_placeholder_and_the_dashboard_title(browser: Any, web_server: Server) -> None:
    """At 375 px the prompt box is as tall as its two-line placeholder (one row cut the second
    line off) and the dashboard's title stays on one line (it wrapped). A narrow window with a
    mouse: a touch screen's placeholder is shorter (``test_enter_adds_a_line_on_a_touch_screen``)."""
    context = browser.new_context(viewport={"width": 375, "height": 740})
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        open_playground(page, web_server)
        # the height the placeholder needs: a copy of the box (same width) holding it as text
        fits = """() => {
            const box = document.querySelector('#prompt');
            const copy = box.cloneNode();
            copy.style.height = 'auto';
            copy.style.position = 'absolute';
            copy.style.width = box.getBoundingClientRect().width + 'px';
            copy.value = box.placeholder;
            box.parentNode.insertBefore(copy, box);
            const need = copy.scrollHeight;
            copy.remove();
            return [box.clientHeight, need];
        }"""
        have, need = page.evaluate(fits)
        assert have >= need, (have, need)
        page.click("#settings-toggle")
        page.click("#mode [data-mode=completion]")  # another placeholder
        page.click("#settings-toggle")
        have, need = page.evaluate(fits)
        assert have >= need, (have, need)
        page.goto(web_server.url + "/dashboard")
        page.wait_for_function("window.surgeDashboard && window.surgeDashboard.samples >= 1")
        lines = page.evaluate(
            """() => {
            const r = document.createRange();
            r.selectNodeContents(document.querySelector('.dash-head h1'));
            return new Set([...r.getClientRects()].map((x) => Math.round(x.top))).size;
        }"""
        )
        assert lines == 1
        assert page.evaluate("document.documentElement.scrollWidth") == 375
    finally:
        context.close()


def test_enter_adds_a_line_on_a_touch_screen(browser: Any, web_server: Server) -> None:
    """On a phone (a coarse pointer, a touch keyboard) Enter adds a line and the Send button sends,
    as in common chat apps (Enter sent the message: a phone's keyboard has no Shift+Enter); with a
    mouse Enter still sends (``test_max_tokens_5``)."""
    context = browser.new_context(viewport={"width": 375, "height": 740}, is_mobile=True, has_touch=True)
    try:
        page = context.new_page()
        page.set_default_timeout(30_000)
        open_playground(page, web_server)
        assert page.evaluate("matchMedia('(pointer: coarse)').matches") is True
        assert page.get_attribute("#prompt", "placeholder") == "Send a message"
        sent: list[str] = []
        page.on("request", lambda r: sent.append(r.url) if "/v1/chat/completions" in r.url else None)
        page.click("#settings-toggle")
        page.fill("#max_tokens", "5")
        page.click("#settings-toggle")
        page.tap("#prompt")
        page.keyboard.type("Hello")
        page.keyboard.press("Enter")
        page.keyboard.type("there")
        assert page.input_value("#prompt") == "Hello\nthere"
        assert page.locator(".msg.user").count() == 0
        page.tap("#send")
        m = wait_finished(page)
        assert m["state"] == "done" and m["tokens"] == "5", m
        assert len(sent) == 1
        assert page.locator(".msg.user .body").first.text_content() == "Hello\nthere"
    finally:
        context.close()


def _chunk(d: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": d, "finish_reason": finish}]}


def test_a_rate_is_not_shown_for_events_that_came_together(page: Any, web_server: Server) -> None:
    """A short answer whose events arrive in one network read (a fraction of a millisecond
    apart) shows no tokens/s: the rate over that span read 70,000 tokens/s. The page's clock
    is replaced by one that moves 1 ms per reading, so the events are never at equal times
    (which the old code also left blank) and the check does not depend on the browser's clock."""
    page.add_init_script("(() => { let t = 0; performance.now = () => (t += 1); })()")
    open_playground(page, web_server)
    chunks = [_chunk({"content": w}) for w in ("a", " b", " c", " d")]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    chunks.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}})
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_sse(chunks)
        ),
    )
    page.fill("#prompt", "Hi")
    page.click("#send")
    m = wait_finished(page)
    assert m["state"] == "done" and m["tokens"] == "4" and m["text"] == "a b c d", m
    assert m["tps"] == "–"


def test_a_refused_question_goes_back_to_the_prompt_box(page: Any, web_server: Server) -> None:
    """A 400 before any output: the question leaves the screen as it leaves the conversation and
    returns to the prompt box (it was cleared, and stayed on screen though never sent again)."""
    open_playground(page, web_server)
    page.fill("#max_tokens", "4")
    page.fill("#prompt", "My name is Ann.")
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    page.fill("#max_tokens", "900")  # past the bundled model's 512-token context: a 400
    page.fill("#prompt", "My dog is Rex.")
    page.click("#send")
    page.wait_for_selector(".msg.error")
    page.wait_for_function("!document.getElementById('send').hidden")
    # the server's "maximum context length" 400, with what to do in a conversation
    error = page.locator(".msg.error .body").text_content()
    assert "maximum context length" in error and "start a New chat, or set a lower Max tokens" in error, error
    assert page.input_value("#prompt") == "My dog is Rex."
    assert [t.strip() for t in page.locator(".msg.user .body").all_text_contents()] == ["My name is Ann."]
    page.fill("#max_tokens", "4")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    users = [m["content"] for m in req.value.post_data_json["messages"] if m["role"] == "user"]
    assert users == ["My name is Ann.", "My dog is Rex."]
    wait_finished(page)


def test_switching_modes_asks_before_clearing_a_conversation(page: Any, web_server: Server) -> None:
    """The modes share no conversation, so a switch clears it: with one on screen the page asks
    first, and a No keeps it (it was deleted without a word, even mid-stream)."""
    open_playground(page, web_server)
    page.fill("#max_tokens", "4")
    page.fill("#prompt", "Hello")
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    asked: list[str] = []

    def dismiss(d: Any) -> None:
        asked.append(d.message)
        d.dismiss()

    page.once("dialog", dismiss)
    page.click("#mode [data-mode=completion]")
    assert asked == ["Switch to completion? This clears the conversation."]
    assert page.get_attribute("#mode [data-mode=chat]", "aria-pressed") == "true"
    assert page.locator(".msg.user").count() == 1
    page.once("dialog", lambda d: d.accept())
    page.click("#mode [data-mode=completion]")
    assert page.get_attribute("#mode [data-mode=completion]", "aria-pressed") == "true"
    assert page.locator(".msg").count() == 0


_REFUSAL = json.dumps(
    {"error": {"message": "nope", "type": "invalid_request_error", "param": None, "code": 400}}
)


def _hold(page: Any, held: list[Any]) -> None:
    """Wait until the page's request reached the route that holds it."""
    for _ in range(200):
        if held:
            return
        page.wait_for_timeout(25)
    raise AssertionError("the request never came")


def test_a_refused_question_stays_when_something_was_typed_meanwhile(page: Any, web_server: Server) -> None:
    """Text typed in the prompt box while a request is in flight is kept when that request is
    refused, and the refused question stays on screen, marked as left out (it was removed, so
    it was neither on screen nor in the box)."""
    open_playground(page, web_server)
    held: list[Any] = []
    page.route("**/v1/chat/completions", lambda route: held.append(route))
    page.fill("#prompt", "first question")
    page.click("#send")
    _hold(page, held)
    page.fill("#prompt", "draft")
    held[0].fulfill(status=400, content_type="application/json", body=_REFUSAL)
    page.wait_for_selector(".msg.error")
    page.wait_for_function("!document.getElementById('send').hidden")
    assert page.input_value("#prompt") == "draft"
    assert page.locator(".msg.user.left-out .body").all_text_contents() == ["first question"]
    assert page.locator(".msg.assistant").count() == 0


def test_switching_modes_after_only_an_error_does_not_ask(page: Any, web_server: Server) -> None:
    """With no conversation on screen (a first question refused, back in the prompt box) a mode
    switch does not ask: it would say it clears a conversation there is none of."""
    open_playground(page, web_server)
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(status=400, content_type="application/json", body=_REFUSAL),
    )
    page.fill("#prompt", "Hello")
    page.click("#send")
    page.wait_for_selector(".msg.error")
    asked: list[str] = []
    page.on("dialog", lambda d: (asked.append(d.message), d.dismiss()))
    page.click("#mode [data-mode=completion]")
    assert asked == []
    assert page.get_attribute("#mode [data-mode=completion]", "aria-pressed") == "true"
    assert page.input_value("#prompt") == "Hello"


def test_pages_behind_a_proxy_under_a_path_prefix(page: Any, web_server: Server) -> None:
    """A proxy that serves Surge under ``/surge/`` and strips the prefix (the pages work so with or
    without ``--root-path /surge``), played by the page's routes: the playground loads its files,
    lists the models, answers a chat and links to the dashboard, which reads /metrics, all through
    the prefix. Their root-relative URLs (``/ui/style.css``, ``fetch("/v1/models")``) missed it."""
    base = web_server.url
    outside: list[str] = []

    def proxied(route: Any) -> None:
        url = route.request.url
        if not url.startswith(base + "/surge/"):
            outside.append(url)
            route.abort("connectionrefused")
            return
        response = route.fetch(url=base + "/" + url[len(base + "/surge/") :])
        route.fulfill(response=response)

    page.route(base + "/**", proxied)
    page.goto(base + "/surge/")
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    page.fill("#max_tokens", "8")
    page.check("#ignore_eos")
    page.fill("#prompt", "Hello")
    page.click("#send")
    page.wait_for_selector(".msg.assistant")
    m = wait_finished(page)
    assert m["state"] == "done" and m["tokens"] == "8", m
    page.click("a[href='dashboard']")
    page.wait_for_url(base + "/surge/dashboard")
    page.wait_for_load_state("networkidle")
    assert page.evaluate("() => getComputedStyle(document.body).fontFamily") != ""
    assert outside == [], outside


def test_playground_under_a_path_prefix_without_its_slash(page: Any, web_server: Server) -> None:
    """A proxy that strips ``/surge`` serves the playground at ``/surge`` too (``/surge`` -> ``/``);
    there the page's relative URLs resolved outside the prefix (``ui/style.css`` to ``/ui/style.css``,
    ``v1/models`` to ``/v1/models``), so the page came unstyled and dead. It reloads itself at
    ``/surge/``, keeping the query string, and works there."""
    base = web_server.url
    outside: list[str] = []

    def proxied(route: Any) -> None:
        url = route.request.url
        rest = url[len(base + "/surge") :] if url.startswith(base + "/surge") else None
        if rest is None or not (rest == "" or rest[0] in "/?"):
            outside.append(url)
            with contextlib.suppress(PlaywrightError):
                route.abort("connectionrefused")
            return
        # the slash-less page's own fetches are disposed once it has reloaded itself
        with contextlib.suppress(PlaywrightError):
            route.fulfill(response=route.fetch(url=base + "/" + rest.removeprefix("/")))

    from playwright.sync_api import Error as PlaywrightError

    page.route(base + "/**", proxied)
    page.goto(base + "/surge?x=1")
    page.wait_for_url(base + "/surge/?x=1", timeout=5_000)
    outside.clear()  # the browser's preload scanner may fetch the slash-less page's files first
    page.reload()
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.evaluate("() => getComputedStyle(document.body).fontFamily") != ""
    assert outside == [], outside
    page.unroute_all(behavior="ignoreErrors")  # no handler outlives the test (the browser is shared)


def test_long_unbroken_reasoning_wraps(page: Any, web_server: Server) -> None:
    """A reasoning line without a space (a URL, a hash, a model's run of one character) wraps
    inside the message as the answer does: it stretched the chat sideways under a scroll bar."""
    open_playground(page, web_server)
    long = "x" * 3000
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": long}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {"content": long}, "finish_reason": "stop"}]},
    ]
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_sse(chunks)
        ),
    )
    page.fill("#prompt", "Think")
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    page.click(".msg.assistant details.reasoning summary")  # unfold it
    assert page.locator(".msg.assistant .reasoning-text").is_visible()
    widths = page.evaluate(
        "() => { const m = document.querySelector('#messages'); return [m.scrollWidth, m.clientWidth]; }"
    )
    assert widths[0] <= widths[1], widths


@pytest.mark.parametrize("clipboard_api", [True, False])
def test_copy_button_copies_the_answer(browser: Any, web_server: Server, clipboard_api: bool) -> None:
    """Each answer gets a Copy button once it ends with text, which puts the answer's text (not
    its reasoning or stats) on the clipboard; without the Clipboard API (a server reached over
    plain http at a host name) the page's copy command does it."""
    context = browser.new_context()
    try:
        if clipboard_api:
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=web_server.url)
        else:  # as on http://host:8000: no navigator.clipboard
            context.add_init_script("Object.defineProperty(navigator, 'clipboard', {value: undefined})")
        context.add_init_script(
            "document.addEventListener('copy', (e) => { const t = e.target;"
            " window.__copied = t.value.slice(t.selectionStart, t.selectionEnd); })"
        )
        page = context.new_page()
        page.set_default_timeout(30_000)
        open_playground(page, web_server)
        answer = "Hello ```\nx = 1\n``` world"
        chunks = [
            {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {"content": answer}, "finish_reason": "stop"}]},
        ]
        page.route(
            "**/v1/chat/completions",
            lambda route: route.fulfill(
                status=200, headers={"content-type": "text/event-stream"}, body=_sse(chunks)
            ),
        )
        page.fill("#prompt", "Hi")
        page.click("#send")
        assert wait_finished(page)["state"] == "done"
        copy = page.locator(".msg.assistant .stats .copy")
        assert copy.is_visible() and copy.get_attribute("type") == "button"
        copy.click()
        page.wait_for_function("document.querySelector('.msg.assistant .copy').textContent === 'Copied'")
        got = page.evaluate("navigator.clipboard.readText()" if clipboard_api else "window.__copied")
        assert got == answer
        assert page.evaluate("document.activeElement.tagName") == "BUTTON"  # focus stays on Copy
    finally:
        context.close()


def test_no_copy_button_without_answer_text(page: Any, web_server: Server) -> None:
    open_playground(page, web_server)
    chunks = [{"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": "length"}]}]
    page.route(
        "**/v1/chat/completions",
        lambda route: route.fulfill(
            status=200, headers={"content-type": "text/event-stream"}, body=_sse(chunks)
        ),
    )
    page.fill("#prompt", "Hi")
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    assert not page.locator(".msg.assistant .stats .copy").is_visible()


def test_settings_are_kept_over_a_reload(page: Any, web_server: Server) -> None:
    """The system prompt and the sampling settings come back after a reload (they were all lost)
    and are sent as set; a slider put back to the model's default stays there, and the API key
    is not kept with them (it stays in the tab's session storage)."""
    open_playground(page, web_server)
    page.fill("#system", "Be brief.")
    set_range(page, "#temperature", 1.5)
    set_range(page, "#top_p", 0.5)
    page.click("#top_p-reset")
    page.fill("#top_k", "7")
    page.fill("#max_tokens", "3")
    page.fill("#seed", "42")
    page.fill("#stop", "END\\n")
    page.select_option("#thinking", "off")
    page.check("#ignore_eos")
    page.reload()
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.input_value("#system") == "Be brief."
    assert page.text_content("#temperature-value") == "1.50"
    assert page.text_content("#top_p-value") == "model default"
    assert page.input_value("#top_k") == "7" and page.input_value("#max_tokens") == "3"
    assert page.input_value("#seed") == "42" and page.input_value("#stop") == "END\\n"
    assert page.input_value("#thinking") == "off" and page.is_checked("#ignore_eos")
    page.fill("#prompt", "Hi")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    body = req.value.post_data_json
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert body["temperature"] == 1.5 and "top_p" not in body
    assert (body["top_k"], body["max_tokens"], body["seed"]) == (7, 3, 42)
    assert body["stop"] == ["END\n"] and body["ignore_eos"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert wait_finished(page)["tokens"] == "3"
    stored = page.evaluate("JSON.stringify(localStorage)")
    assert "Be brief." in stored and "apiKey" not in stored


def test_escape_stops_the_answer_and_a_screen_reader_waits_for_its_end(page: Any, web_server: Server) -> None:
    """Escape stops a streaming answer (the focus is in the prompt box after Send, away from the
    Stop button); the conversation is a log (read out as messages come) whose streaming answer is
    busy until it ends, so a screen reader reads it once instead of token by token."""
    open_playground(page, web_server)
    assert page.get_attribute("#messages-inner", "role") == "log"
    page.fill("#max_tokens", "400")
    page.check("#ignore_eos")
    page.fill("#prompt", "Tell me a story.")
    page.keyboard.press("Enter")
    page.wait_for_function(f"() => Number(({LAST})().dataset.events || 0) >= 3")
    assert page.evaluate(f"({LAST})().getAttribute('aria-busy')") == "true"
    assert page.evaluate("document.activeElement.id") == "prompt"
    page.keyboard.press("Escape")
    m = wait_finished(page)
    assert m["state"] == "stopped" and int(m["tokens"]) < 400, m
    assert page.evaluate(f"({LAST})().getAttribute('aria-busy')") is None
    page.keyboard.press("Escape")  # with nothing in flight: nothing happens
    assert page.locator(".msg.assistant").count() == 1 and page.locator(".msg.error").count() == 0


def test_prompt_tokens_are_shown(page: Any, web_server: Server) -> None:
    """Under an answer the prompt's token count (the usage's prompt_tokens: how much of the
    context the turn took) shows next to the answer's."""
    open_playground(page, web_server)
    page.click("#mode [data-mode=completion]")
    page.fill("#max_tokens", "4")
    page.fill("#prompt", "Once upon a time")
    page.click("#send")
    assert wait_finished(page)["state"] == "done"
    model = page.input_value("#model")
    count = httpx.post(
        web_server.url + "/tokenize", json={"model": model, "prompt": "Once upon a time"}
    ).json()
    shown = page.evaluate(f"({LAST})().querySelector('[data-stat=prompt] b').textContent")
    assert shown == str(count["count"])


WEATHER_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
            },
        },
    }
]


def test_tool_calls_are_shown_and_answered_with_a_tool_result(page: Any, web_server: Server) -> None:
    """The Tools and Tool choice boxes are sent as `tools` and `tool_choice` (a bare name forces
    a call of that function, so the bundled model calls it); the streamed call shows its name and
    its arguments, joined from their deltas as the unstreamed answer has them; its result goes
    back as a `tool` message answering the call's id, and Send with an empty prompt box then
    continues the conversation. The playground sent no tools and showed no call before."""
    open_playground(page, web_server)
    page.fill("#tools", json.dumps(WEATHER_TOOLS, indent=2))
    page.fill("#tool_choice", "get_weather")
    page.fill("#seed", "5")
    page.fill("#max_tokens", "60")
    page.fill("#prompt", "What is the weather in Paris?")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    body = req.value.post_data_json
    assert body["tools"] == WEATHER_TOOLS
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    m = wait_finished(page)
    assert m["state"] == "done" and m["events"] >= 2, m  # the arguments came in several deltas
    assert page.locator(".msg.error").count() == 0
    call = page.locator(".msg.assistant .tool-call")
    assert call.count() == 1
    assert call.locator(".tool-name").text_content() == "get_weather"
    # the same request unstreamed (same seed): its call is the one the deltas were joined into
    whole = httpx.post(
        web_server.url + "/v1/chat/completions",
        json={k: v for k, v in body.items() if k not in ("stream", "stream_options")},
        timeout=120,
    ).json()["choices"][0]["message"]["tool_calls"]
    assert len(whole) == 1 and whole[0]["function"]["name"] == "get_weather"
    args = whole[0]["function"]["arguments"]
    assert json.loads(call.locator(".tool-args").text_content()) == json.loads(args)
    assert call.locator(".tool-args").text_content() == json.dumps(json.loads(args), indent=2)
    assert not page.locator(".msg.assistant .body").is_visible()  # no text: no empty bubble

    page.fill(".tool-result textarea", '{"temperature": 21}')
    page.click(".tool-result button")
    assert page.locator(".tool-result").count() == 0
    assert page.locator(".msg.tool .body").text_content() == '{"temperature": 21}'
    assert "tool results" in page.get_attribute("#prompt", "placeholder")
    page.fill("#tool_choice", "none")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")  # the prompt box is empty
    messages = req.value.post_data_json["messages"]
    assert req.value.post_data_json["tool_choice"] == "none"
    assert messages[0] == {"role": "user", "content": "What is the weather in Paris?"}
    answer = messages[1]
    assert answer["role"] == "assistant" and answer["content"] == ""
    assert [c["function"] for c in answer["tool_calls"]] == [{"name": "get_weather", "arguments": args}]
    call_id = answer["tool_calls"][0]["id"]
    assert call_id and answer["tool_calls"][0]["type"] == "function"
    assert messages[2:] == [{"role": "tool", "tool_call_id": call_id, "content": '{"temperature": 21}'}]
    m = wait_finished(page)
    assert m["state"] == "done" and m["text"], m
    assert page.locator(".msg.error").count() == 0 and page.locator(".msg.user").count() == 1
    assert "tool results" not in page.get_attribute("#prompt", "placeholder")


def test_tools_that_are_not_json_are_refused_with_a_message(page: Any, web_server: Server) -> None:
    """A Tools or Tool choice box that cannot be read says why under the box as it is typed, and
    Send then sends nothing: the message shows, the box has the focus, the prompt stays."""
    open_playground(page, web_server)
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/v1/chat/completions" in r.url else None)
    assert page.text_content("#tools-error") == "" and not page.is_visible("#tools-error")
    page.fill("#tools", '[{"type": "function",}]')
    message = page.text_content("#tools-error")
    assert message.startswith("Tools must be valid JSON: ") and "position" in message, message
    assert page.get_attribute("#tools", "aria-invalid") == "true" and page.is_visible("#tools-error")
    page.fill("#prompt", "Hello")
    page.click("#send")
    page.locator(".msg.error").wait_for()
    assert page.locator(".msg.error .body").text_content() == message
    assert page.evaluate("document.activeElement.id") == "tools"
    page.fill("#tools", '{"type": "function"}')
    assert page.text_content("#tools-error") == (
        'Tools must be a JSON array of tools ([{"type": "function", ...}]), not an object.'
    )
    page.fill("#tools", '[{"type": "function"}, "get_weather"]')
    assert page.text_content("#tools-error") == "Tools: item 2 must be a tool object, not a string."
    page.fill("#tools", json.dumps(WEATHER_TOOLS))
    assert page.get_attribute("#tools", "aria-invalid") is None and page.text_content("#tools-error") == ""
    page.fill("#tool_choice", '{"type": "function"')
    choice_message = page.text_content("#tool_choice-error")
    assert choice_message.startswith("Tool choice must be auto, none, required, a tool's name or JSON: ")
    page.click("#send")
    page.wait_for_function("document.querySelectorAll('.msg.error').length === 2")
    assert page.locator(".msg.error .body").last.text_content() == choice_message
    assert page.evaluate("document.activeElement.id") == "tool_choice"
    assert sent == [] and page.locator(".msg.user").count() == 0
    assert page.input_value("#prompt") == "Hello"
    page.fill("#tool_choice", "required")
    page.fill("#max_tokens", "30")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert req.value.post_data_json["tool_choice"] == "required"
    assert wait_finished(page)["state"] == "done"
    assert page.locator(".msg.assistant .tool-call .tool-name").first.text_content() == "get_weather"
    # completions take no tools: the section is hidden and nothing of it is sent
    page.once("dialog", lambda d: d.accept())
    page.click("#mode [data-mode=completion]")
    assert not page.is_visible("#tools-section")
    page.fill("#prompt", "Once upon a time")
    with page.expect_request("**/v1/completions") as req:
        page.click("#send")
    assert not {"tools", "tool_choice"} & req.value.post_data_json.keys()
    assert wait_finished(page)["state"] == "done"


def test_tool_settings_are_kept_over_a_reload(page: Any, web_server: Server) -> None:
    """The Tools and Tool choice boxes come back after a reload with the other settings, and a
    box kept with text that cannot be read says so at once."""
    open_playground(page, web_server)
    tools = json.dumps(WEATHER_TOOLS, indent=2)
    page.fill("#tools", tools)
    page.fill("#tool_choice", "get_weather")
    page.reload()
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.input_value("#tools") == tools and page.input_value("#tool_choice") == "get_weather"
    assert page.text_content("#tools-error") == "" and page.text_content("#tool_choice-error") == ""
    page.fill("#tool_choice", "{")
    page.reload()
    page.wait_for_function("document.querySelector('#model').options.length > 0")
    assert page.input_value("#tool_choice") == "{"
    assert page.get_attribute("#tool_choice", "aria-invalid") == "true"
    assert page.text_content("#tool_choice-error").startswith("Tool choice must be")


def test_a_tool_call_cut_short_is_left_out_of_the_conversation(page: Any, web_server: Server) -> None:
    """A call cut by max tokens has arguments that are not whole JSON; kept in the conversation as
    the answer's ``tool_calls``, it made every later request a 400 ("arguments are not valid
    JSON"), so the chat could only be started anew. It is shown dimmed, with no result box, and
    the turn is not sent again."""
    open_playground(page, web_server)
    page.fill("#tools", json.dumps(WEATHER_TOOLS))
    page.fill("#tool_choice", "get_weather")
    page.fill("#max_tokens", "3")
    page.fill("#prompt", "What is the weather in Paris?")
    page.click("#send")
    m = wait_finished(page)
    assert m["state"] == "done" and m["finish"] == "length", m
    call = page.locator(".msg.assistant .tool-call")
    assert call.count() == 1
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.locator(".tool-args").text_content())
    assert page.locator(".tool-result").count() == 0
    assert "left-out" in (call.get_attribute("class") or "")
    page.fill("#tool_choice", "none")
    page.fill("#max_tokens", "5")
    page.fill("#prompt", "Hello")
    with page.expect_request("**/v1/chat/completions") as req:
        page.click("#send")
    assert req.value.post_data_json["messages"] == [{"role": "user", "content": "Hello"}]
    assert wait_finished(page)["state"] == "done"
    assert page.locator(".msg.error").count() == 0
