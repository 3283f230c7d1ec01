// Surge playground: chat and raw completions streamed over the OpenAI-compatible API.
"use strict";

(() => {
  const C = window.SurgeCommon;
  const $ = (id) => document.getElementById(id);

  const ui = {
    model: $("model"),
    system: $("system"),
    systemField: $("system-field"),
    temperature: $("temperature"),
    topP: $("top_p"),
    topK: $("top_k"),
    maxTokens: $("max_tokens"),
    seed: $("seed"),
    stop: $("stop"),
    thinking: $("thinking"),
    ignoreEos: $("ignore_eos"),
    tools: $("tools"),
    toolChoice: $("tool_choice"),
    toolsSection: $("tools-section"),
    apiKey: $("api-key"),
    keyField: $("key-field"),
    keyNotice: $("key-notice"),
    messages: $("messages"),
    inner: $("messages-inner"),
    empty: $("empty"),
    composer: $("composer"),
    prompt: $("prompt"),
    send: $("send"),
    stopBtn: $("stop-btn"),
    newChat: $("new-chat"),
    sidebar: $("sidebar"),
    settingsToggle: $("settings-toggle"),
    modeButtons: [...document.querySelectorAll("#mode button")],
  };

  const state = {
    mode: "chat", // or "completion"
    history: [], // chat messages sent so far: {role, content}, an answer's tool_calls, a tool_call_id
    controller: null, // AbortController of the request in flight
    epoch: 0, // bumped by "New chat", so an answer that ends later leaves the new history alone
  };

  // ---------- settings ----------

  const SETTINGS_STORAGE = "surge.settings";
  /** The settings kept over a reload (in local storage; the API key is not one of them). */
  const kept = [ui.system, ui.temperature, ui.topP, ui.topK, ui.maxTokens, ui.seed, ui.stop];
  kept.push(ui.thinking, ui.ignoreEos, ui.tools, ui.toolChoice);

  /** Keep the settings panel's values in local storage: {id: value}, a checkbox as a boolean, a
   * slider only once moved (an untouched one stays at the model's default). */
  function saveSettings() {
    const saved = {};
    for (const input of kept) {
      if (input.type === "checkbox") saved[input.id] = input.checked;
      else if (input.type !== "range" || input.dataset.touched) saved[input.id] = input.value;
    }
    try {
      localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(saved));
    } catch (e) {
      /* storage disabled or full: the settings last until the page is closed */
    }
  }

  /** Put back the settings that saveSettings kept (anything unreadable is left at its default). */
  function restoreSettings() {
    let saved;
    try {
      saved = JSON.parse(localStorage.getItem(SETTINGS_STORAGE) || "{}");
    } catch (e) {
      return;
    }
    if (!saved || typeof saved !== "object") return;
    for (const input of kept) {
      const v = saved[input.id];
      if (input.type === "checkbox") {
        if (typeof v === "boolean") input.checked = v;
      } else if (typeof v === "string") {
        input.value = v;
        if (input.type === "range") input.dataset.touched = "1";
      }
    }
  }
  restoreSettings();

  /** A slider starts at "model default" and is not sent until moved, so the server applies
   * the model's own default (its generation_config.json, as for any request that leaves the
   * field out); once moved it shows and sends its value, and its reset button brings the
   * model's default back. */
  function showRange(input, digits) {
    const out = $(input.id + "-value");
    const reset = $(input.id + "-reset");
    const update = () => {
      out.textContent = input.dataset.touched ? Number(input.value).toFixed(digits) : "model default";
      reset.hidden = !input.dataset.touched;
    };
    input.addEventListener("input", () => {
      input.dataset.touched = "1";
      update();
    });
    reset.addEventListener("click", (e) => {
      e.preventDefault(); // inside the label: no click on the slider
      delete input.dataset.touched;
      input.value = input.defaultValue;
      update();
      saveSettings();
      input.focus();
    });
    update();
  }
  showRange(ui.temperature, 2);
  showRange(ui.topP, 2);
  for (const input of kept) {
    // after showRange's own listener, which marks a moved slider as touched
    input.addEventListener("input", saveSettings);
    input.addEventListener("change", saveSettings);
  }

  /** The whole number in a number field, null when it is empty. Throws (and marks and focuses
   * the field) when it holds anything else, so a setting is never silently left out: the browser
   * gives "" for text it cannot read as a number ("1e"), which `validity.badInput` tells apart. */
  function intOrNull(input, label) {
    const v = input.value.trim();
    if (v === "" && !input.validity.badInput) return null;
    const n = Number(v);
    if (v !== "" && Number.isSafeInteger(n)) return n;
    input.setAttribute("aria-invalid", "true");
    input.focus();
    throw new Error(`${label} must be a whole number${v ? `, not ${v}` : ""} (or empty for the default).`);
  }
  for (const input of [ui.topK, ui.maxTokens, ui.seed]) {
    input.addEventListener("input", () => input.removeAttribute("aria-invalid"));
  }

  /** A stop string as typed: `\n` is a line break, `\t` a tab and `\\` one backslash (a line
   * break cannot be typed otherwise: each line of the box is one stop string). */
  function unescapeStop(line) {
    return line.replace(/\\([nt\\])/g, (_, c) => (c === "n" ? "\n" : c === "t" ? "\t" : "\\"));
  }

  /** What a JSON value is, in words ("an object", "a string"), for a message. */
  function kindOf(v) {
    if (v === null) return "null";
    if (Array.isArray(v)) return "an array";
    return typeof v === "object" ? "an object" : `a ${typeof v}`;
  }

  /** The Tools box: empty for no tools, else a JSON array of tool objects, sent as `tools` as
   * it is (the server checks each tool and answers a bad one with a 400 that names it).
   * Throws an Error that says what is wrong with the box's text. */
  function parseTools(text) {
    if (!text.trim()) return null;
    let tools;
    try {
      tools = JSON.parse(text);
    } catch (e) {
      throw new Error(`Tools must be valid JSON: ${e.message}.`);
    }
    if (!Array.isArray(tools)) {
      throw new Error(`Tools must be a JSON array of tools ([{"type": "function", ...}]), not ${kindOf(tools)}.`);
    }
    const bad = tools.findIndex((t) => kindOf(t) !== "an object");
    if (bad >= 0) throw new Error(`Tools: item ${bad + 1} must be a tool object, not ${kindOf(tools[bad])}.`);
    return tools;
  }

  /** The Tool choice box: empty leaves `tool_choice` to the server (auto with tools); `auto`,
   * `none` and `required` are sent as they are; a bare name (OpenAI's function name pattern)
   * forces a call of that function ({"type": "function", "function": {"name"}}); anything else
   * must be JSON, sent as it is. Undefined when empty; throws an Error on text that is none of these. */
  function parseToolChoice(text) {
    const v = text.trim();
    if (!v) return undefined;
    if (v === "auto" || v === "none" || v === "required") return v;
    if (/^[A-Za-z0-9_-]{1,64}$/.test(v)) return { type: "function", function: { name: v } };
    try {
      return JSON.parse(v);
    } catch (e) {
      throw new Error(`Tool choice must be auto, none, required, a tool's name or JSON: ${e.message}.`);
    }
  }

  const toolBoxes = [
    [ui.tools, parseTools],
    [ui.toolChoice, parseToolChoice],
  ];

  /** Check the Tools and Tool choice boxes as they are typed: a box that cannot be read is marked
   * (aria-invalid) and the reason shows under it, until it is fixed. */
  function checkToolBoxes() {
    for (const [input, parse] of toolBoxes) {
      const out = $(input.id + "-error");
      try {
        parse(input.value);
        input.removeAttribute("aria-invalid");
        out.textContent = "";
      } catch (e) {
        input.setAttribute("aria-invalid", "true");
        out.textContent = e.message;
      }
    }
  }
  for (const [input] of toolBoxes) input.addEventListener("input", checkToolBoxes);
  checkToolBoxes(); // a box restored from local storage

  /** `tools` and `tool_choice` for a chat request, from their boxes (an empty box sends nothing).
   * Throws (and focuses the box) when a box cannot be read, so nothing is sent. */
  function toolFields() {
    const fields = {};
    for (const [input, parse] of toolBoxes) {
      let value;
      try {
        value = parse(input.value);
      } catch (e) {
        checkToolBoxes();
        input.focus();
        throw e;
      }
      if (value !== null && value !== undefined) fields[input === ui.tools ? "tools" : "tool_choice"] = value;
    }
    return fields;
  }

  /** The request fields common to both endpoints, from the settings panel. An empty max tokens
   * ("auto") leaves max_tokens out: chat's default is all the room left in the context;
   * completions default to 16 (null too, as in OpenAI's API and vLLM), so send() asks them for
   * the room left itself (roomLeft); chat adds the tools (toolFields). Throws on a field that is
   * not a whole number, or a tools box that cannot be read. */
  function samplingFields(chat) {
    const body = {
      model: ui.model.value,
      stream: true,
      stream_options: { include_usage: true },
    };
    if (ui.temperature.dataset.touched) body.temperature = Number(ui.temperature.value);
    if (ui.topP.dataset.touched) body.top_p = Number(ui.topP.value);
    const maxTokens = intOrNull(ui.maxTokens, "Max tokens");
    if (maxTokens !== null) body.max_tokens = maxTokens;
    const topK = intOrNull(ui.topK, "Top k");
    if (topK !== null) body.top_k = topK;
    const seed = intOrNull(ui.seed, "Seed");
    if (seed !== null) body.seed = seed;
    const stops = ui.stop.value
      .split("\n")
      .filter((s) => s.length > 0)
      .map(unescapeStop);
    if (stops.length) body.stop = stops;
    if (ui.ignoreEos.checked) body.ignore_eos = true;
    if (chat) Object.assign(body, toolFields());
    return body;
  }

  // ---------- models and the API key ----------

  async function loadModels() {
    let r;
    try {
      r = await fetch("v1/models", { headers: C.headers(false), cache: "no-store" });
    } catch (e) {
      return;
    }
    if (r.status === 401) {
      ui.keyField.hidden = false;
      ui.keyNotice.hidden = false;
      ui.keyNotice.textContent = C.getApiKey()
        ? "The API key was refused."
        : "This server needs an API key.";
      ui.model.replaceChildren();
      return;
    }
    ui.keyNotice.hidden = true;
    if (!r.ok) return;
    const body = await r.json();
    const previous = ui.model.value;
    ui.model.replaceChildren();
    for (const m of body.data || []) {
      // a model folder path shows as its last part; the full name is the value and the tooltip
      const opt = C.el("option", null, m.id.replace(/\/+$/, "").split("/").pop() || m.id);
      opt.value = m.id;
      opt.title = m.id;
      ui.model.appendChild(opt);
    }
    if (previous && [...ui.model.options].some((o) => o.value === previous)) ui.model.value = previous;
  }

  if (C.getApiKey()) {
    ui.keyField.hidden = false;
    ui.apiKey.value = C.getApiKey();
  }
  let keyTimer = null;
  ui.keyField.addEventListener("submit", (e) => e.preventDefault());
  ui.apiKey.addEventListener("input", () => {
    C.setApiKey(ui.apiKey.value.trim());
    clearTimeout(keyTimer);
    keyTimer = setTimeout(loadModels, 300);
  });

  // ---------- messages ----------

  function scrollToEnd(force) {
    const m = ui.messages;
    if (force || m.scrollHeight - m.scrollTop - m.clientHeight < 120) m.scrollTop = m.scrollHeight;
  }

  function addUserMessage(text, label, cls = "user") {
    ui.empty.hidden = true;
    const msg = C.el("div", "msg " + cls);
    msg.appendChild(C.el("div", "role", label));
    const body = C.el("div", "body");
    body.dir = "auto"; // Arabic or Hebrew text reads right to left
    C.renderText(body, text);
    msg.appendChild(body);
    ui.inner.appendChild(msg);
    scrollToEnd(true);
    return msg;
  }

  function stat(parent, name, label) {
    const span = C.el("span");
    span.dataset.stat = name;
    const value = C.el("b", null, "–");
    span.append(value, " " + label);
    parent.appendChild(span);
    return value;
  }

  /** An assistant message: folded reasoning, streamed body, tool calls and a stats line. */
  function addAssistantMessage(label) {
    const msg = C.el("div", "msg assistant");
    msg.dataset.state = "streaming";
    msg.setAttribute("aria-busy", "true"); // a screen reader reads the answer once, when it ends
    msg.appendChild(C.el("div", "role", label));
    const reasoning = C.el("details", "reasoning");
    reasoning.hidden = true;
    const summary = C.el("summary", null, "Reasoning");
    const reasoningText = C.el("div", "reasoning-text");
    reasoningText.dir = "auto";
    reasoning.append(summary, reasoningText);
    const body = C.el("div", "body streaming");
    body.dir = "auto";
    const stats = C.el("div", "stats");
    const view = {
      msg,
      reasoning,
      summary,
      reasoningText,
      body,
      calls: C.el("div", "tool-calls"), // one .tool-call per call, shown as its deltas come
      tokens: stat(stats, "tokens", "tokens"),
      tps: stat(stats, "tps", "tok/s"),
      ttft: stat(stats, "ttft", "TTFT"),
      finish: stat(stats, "finish", "finish"),
      prompt: stat(stats, "prompt", "prompt tokens"), // from the usage: the context it took
      copy: C.el("button", "link copy", "Copy"),
    };
    view.copy.type = "button";
    view.copy.hidden = true; // shown once the answer ends with text
    view.copy.title = "Copy the answer's text";
    stats.appendChild(view.copy);
    msg.append(reasoning, body, view.calls, stats);
    ui.inner.appendChild(msg);
    scrollToEnd(true);
    return view;
  }

  function addError(text) {
    const msg = C.el("div", "msg error");
    msg.appendChild(C.el("div", "role", "Error"));
    msg.appendChild(C.el("div", "body", text));
    ui.inner.appendChild(msg);
    scrollToEnd(true);
  }

  // ---------- one streamed request ----------

  /** Swap Send and Stop. The button being hidden hands its focus to the prompt box (a hidden
   * button drops it to the page), so Enter and typing still reach the prompt. */
  function setBusy(busy) {
    const hiding = busy ? ui.send : ui.stopBtn;
    const hadFocus = document.activeElement === hiding;
    ui.send.hidden = busy;
    ui.stopBtn.hidden = !busy;
    if (hadFocus) ui.prompt.focus();
  }

  /** Live numbers of one answer: timing from the send, token events, usage and finish reason. */
  function newRun() {
    return {
      tStart: performance.now(),
      tFirst: null,
      tLast: null,
      events: 0, // content events (one token each at --stream-interval 1)
      text: "",
      reasoning: "",
      calls: [], // tool calls by index: {id, type, function: {name, arguments}}, deltas joined
      usage: null,
      finish: null,
    };
  }

  const MIN_RATE_SPAN_MS = 100;

  function showStats(view, run) {
    const n = run.usage ? run.usage.completion_tokens : run.events;
    view.tokens.textContent = String(n);
    if (run.tFirst !== null) view.ttft.textContent = `${Math.round(run.tFirst - run.tStart)} ms`;
    const streaming = view.msg.dataset.state === "streaming";
    const tEnd = streaming ? performance.now() : run.tLast;
    // decode speed: the tokens after the first over the time after it. It needs two events at
    // least MIN_RATE_SPAN_MS apart: a short answer's events may come in one network read, a
    // fraction of a millisecond apart, which gave rates of 70,000 tokens/s
    if (run.tFirst !== null && run.events > 1 && n > 1 && tEnd - run.tFirst >= MIN_RATE_SPAN_MS) {
      view.tps.textContent = (((n - 1) * 1000) / (tEnd - run.tFirst)).toFixed(1);
    } else if (!streaming) {
      view.tps.textContent = "–"; // a live figure (timed to now) does not outlive a too short run
    }
    view.finish.textContent = run.finish || (streaming ? "…" : "–");
    if (run.usage && Number.isInteger(run.usage.prompt_tokens)) {
      view.prompt.textContent = String(run.usage.prompt_tokens);
    }
  }

  let paintPending = false;
  function schedulePaint(view, run) {
    if (paintPending) return;
    paintPending = true;
    requestAnimationFrame(() => {
      paintPending = false;
      paint(view, run);
    });
  }

  /** A tool call's arguments, indented once they are whole JSON (as they came otherwise). */
  function prettyArguments(args) {
    try {
      return JSON.stringify(JSON.parse(args), null, 2);
    } catch (e) {
      return args;
    }
  }

  /** Whether a call's arguments are whole JSON (empty too: the server reads it as {}); those of a
   * call cut short (max tokens, Stop, a broken stream) are not, and the server refuses a
   * conversation holding them with a 400, so such a call is never sent back. */
  function wholeCall(call) {
    const args = call.function.arguments;
    if (!args.trim()) return true;
    try {
      JSON.parse(args);
      return true;
    } catch (e) {
      return false;
    }
  }

  /** Show the answer's tool calls: the function's name and its arguments as they stream. */
  function paintCalls(view, run) {
    const done = view.msg.dataset.state !== "streaming";
    run.calls.forEach((call, i) => {
      let box = view.calls.children[i];
      if (!box) {
        box = C.el("div", "tool-call");
        const head = C.el("div", "tool-call-head", "Tool call ");
        head.appendChild(C.el("code", "tool-name"));
        box.append(head, C.el("pre", "tool-args"));
        view.calls.appendChild(box);
      }
      box.title = call.id ? `id ${call.id}` : "";
      box.querySelector(".tool-name").textContent = call.function.name;
      const args = call.function.arguments;
      box.querySelector(".tool-args").textContent = done ? prettyArguments(args) : args;
    });
  }

  function paint(view, run) {
    view.msg.dataset.events = String(run.events);
    C.renderText(view.body, run.text);
    // no empty answer box under tool calls, nor under reasoning that ended without an answer
    const ended = view.msg.dataset.state !== "streaming";
    view.body.hidden = !run.text && (run.calls.length > 0 || (ended && !!run.reasoning));
    paintCalls(view, run);
    if (run.reasoning) {
      view.reasoning.hidden = false;
      view.reasoningText.textContent = run.reasoning;
    }
    showStats(view, run);
    scrollToEnd(false);
  }

  function onChunk(chunk, run, view) {
    if (chunk.error) throw new Error(chunk.error.message || "the server sent an error");
    if (chunk.usage) run.usage = chunk.usage;
    const choice = chunk.choices && chunk.choices[0];
    if (!choice) return;
    let piece = "";
    let thought = "";
    let called = false;
    if (state.mode === "chat") {
      const d = choice.delta || {};
      piece = d.content || "";
      thought = d.reasoning_content || d.reasoning || "";
      // a call's deltas: the first has its index, id and name, the next ones more arguments,
      // joined as the openai SDK joins them
      for (const t of d.tool_calls || []) {
        const i = Number.isInteger(t.index) ? t.index : run.calls.length;
        for (let k = run.calls.length; k <= i; k++) {
          run.calls.push({ id: "", type: "function", function: { name: "", arguments: "" } });
        }
        const call = run.calls[i];
        const f = t.function || {};
        if (t.id) call.id = t.id;
        call.function.name += f.name || "";
        call.function.arguments += f.arguments || "";
        called = true;
      }
    } else {
      piece = choice.text || "";
    }
    if (piece || thought || called) {
      const now = performance.now();
      if (run.tFirst === null) run.tFirst = now;
      run.tLast = now;
      run.events++;
      // a chat answer shows (and is sent back) without leading blanks
      run.text += state.mode === "chat" && !run.text ? piece.trimStart() : piece;
      run.reasoning += thought;
    }
    if (choice.finish_reason) run.finish = choice.finish_reason;
    schedulePaint(view, run);
  }

  /** All the room the context leaves after a completions prompt, from /tokenize's count and
   * max_model_len: what max tokens "auto" asks for. Null when /tokenize does not answer or no
   * room is left (max_tokens then stays out, and the completion's own 400 says why). */
  async function roomLeft(model, prompt, signal) {
    const r = await fetch("tokenize", {
      method: "POST",
      headers: C.headers(true),
      body: JSON.stringify({ model, prompt }),
      signal,
    }).catch((e) => {
      if (e.name === "AbortError") throw e;
      return null;
    });
    if (!r || !r.ok) return null;
    const t = await r.json();
    const room = t.max_model_len - t.count;
    return room >= 1 ? room : null;
  }

  /** The role of the conversation's last message ("" when none). */
  function lastRole() {
    const last = state.history[state.history.length - 1];
    return last ? last.role : "";
  }

  /** Under a tool call of a finished answer: a box for the tool's result, which "Add result"
   * puts in the conversation as a `tool` message answering the call (its tool_call_id). Sending
   * then continues the conversation, with or without a new message in the prompt box. */
  function addResultForm(box, call, epoch) {
    const form = C.el("form", "tool-result");
    const result = C.el("textarea");
    result.rows = 1;
    result.required = true;
    result.dir = "auto";
    result.spellcheck = false;
    result.placeholder = `The result of ${call.function.name || "the call"}`;
    result.setAttribute("aria-label", `Result of the tool call ${call.function.name}`);
    const add = C.el("button", "btn", "Add result");
    add.type = "submit";
    form.append(result, add);
    result.addEventListener("keydown", (e) => {
      // as in the prompt box: Enter adds the result, Shift+Enter (or Enter on a touch screen) a line
      if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !touch.matches) {
        e.preventDefault();
        form.requestSubmit(add);
      }
    });
    form.addEventListener("submit", (e) => {
      e.preventDefault();
      if (epoch !== state.epoch || state.controller) return;
      state.history.push({ role: "tool", tool_call_id: call.id, content: result.value });
      form.remove();
      addUserMessage(result.value, `Result of ${call.function.name}`, "tool");
      refreshPlaceholder();
      const next = ui.inner.querySelector(".tool-result textarea");
      (next || ui.prompt).focus(); // the next call's result, else Send
    });
    box.appendChild(form);
  }

  async function send() {
    const text = ui.prompt.value;
    // an empty prompt box after tool results continues the conversation: the model answers them
    const continuing = state.mode === "chat" && !text.trim() && lastRole() === "tool";
    if ((!text.trim() && !continuing) || state.controller) return;
    if (!ui.model.value) {
      await loadModels();
      if (!ui.model.value) {
        addError("No model: the server's /v1/models answered no model (is an API key needed?).");
        return;
      }
    }
    const chat = state.mode === "chat";
    let body;
    try {
      body = samplingFields(chat);
    } catch (e) {
      addError(e.message); // nothing is sent; the prompt stays in the box
      return;
    }
    // a call left without a result can no longer get one: a result comes right after its call
    for (const form of ui.inner.querySelectorAll(".tool-result")) form.remove();
    let url;
    let asked = null; // the question's message (none when continuing after tool results)
    if (chat) {
      if (!continuing) state.history.push({ role: "user", content: text });
      const messages = [];
      if (ui.system.value.trim()) messages.push({ role: "system", content: ui.system.value });
      body.messages = messages.concat(state.history);
      if (ui.thinking.value) body.chat_template_kwargs = { enable_thinking: ui.thinking.value === "on" };
      url = "v1/chat/completions";
      if (!continuing) asked = addUserMessage(text, "You");
    } else {
      body.prompt = text;
      url = "v1/completions";
      asked = addUserMessage(text, "Prompt");
    }
    ui.prompt.value = "";
    autoSize();
    const view = addAssistantMessage(chat ? "Assistant" : "Completion");
    const run = newRun();
    const epoch = state.epoch;
    const controller = new AbortController();
    state.controller = controller;
    setBusy(true);
    const ticker = setInterval(() => showStats(view, run), 250);
    let outcome = "done";
    try {
      if (!chat && body.max_tokens === undefined) {
        const room = await roomLeft(body.model, text, controller.signal);
        if (room !== null) body.max_tokens = room;
        run.tStart = performance.now(); // TTFT counts from the completion request, not /tokenize
      }
      const r = await C.fetchOrExplain(url, {
        method: "POST",
        headers: C.headers(true),
        body: JSON.stringify(body),
        signal: controller.signal,
      });
      if (!r.ok) {
        if (r.status === 401) loadModels();
        let message = await C.errorMessage(r);
        if (chat && state.history.length > 1 && /context length/i.test(message)) {
          message += " (the conversation no longer fits: start a New chat, or set a lower Max tokens)";
        }
        throw new Error(message);
      }
      await C.readSSE(r, (chunk) => onChunk(chunk, run, view));
    } catch (e) {
      if (e.name === "AbortError") {
        outcome = "stopped";
        run.finish = "stopped";
      } else {
        outcome = "error";
        if (!run.text && !run.reasoning && !run.calls.length) {
          // nothing came (refused, unreachable): the question goes back to the prompt box to
          // edit or send again, and leaves the screen as it leaves the conversation below;
          // if something was typed there meanwhile, it stays on screen, marked as left out
          view.msg.remove();
          if (asked && !ui.prompt.value) {
            asked.remove();
            ui.prompt.value = text;
            autoSize();
          }
        }
        addError(e.message || String(e));
      }
    } finally {
      clearInterval(ticker);
      state.controller = null;
      setBusy(false);
      view.msg.dataset.state = outcome;
      view.msg.removeAttribute("aria-busy");
      view.body.classList.remove("streaming");
      if (run.reasoning) view.summary.textContent = `Reasoning (${run.reasoning.length} characters)`;
      paint(view, run);
      if (run.text) {
        view.copy.hidden = false;
        view.copy.addEventListener("click", async () => {
          const ok = await C.copyText(run.text);
          view.copy.textContent = ok ? "Copied" : "Copy failed";
          setTimeout(() => (view.copy.textContent = "Copy"), 1500);
        });
      }
      if (run.reasoning && !run.text) {
        // it ended (max tokens, Stop) while still reasoning: show that instead of an empty answer
        view.reasoning.open = true; // (paint hid the empty answer)
      }
      if (chat && epoch === state.epoch) {
        // a call cut short is shown dimmed, with no result box, and left out of the conversation
        const whole = run.calls.filter(wholeCall);
        if (run.text || whole.length) {
          const answer = { role: "assistant", content: run.text };
          if (whole.length) answer.tool_calls = whole;
          state.history.push(answer);
        }
        run.calls.forEach((call, i) => {
          const box = view.calls.children[i];
          if (whole.includes(call)) {
            addResultForm(box, call, epoch);
          } else {
            box.classList.add("left-out");
            box.title = "Cut short: its arguments are not whole JSON, so it is not part of the conversation";
          }
        });
        if (!run.text && !whole.length) {
          // an answer without text nor a whole call (cut while reasoning or calling, stopped at
          // once): the question is not sent again with later turns (after tool results there is
          // none: they stay, to send again), and the screen says so
          if (asked) state.history.pop();
          const shown = asked && !asked.isConnected ? [] : [asked, view.msg];
          for (const node of shown.filter((n) => n && n.isConnected)) {
            node.classList.add("left-out");
            node.title = "Not part of the conversation: the answer has no text";
          }
        }
        refreshPlaceholder();
      }
    }
  }

  function stop() {
    if (state.controller) state.controller.abort();
  }

  function newChat() {
    stop();
    state.epoch++;
    state.history = [];
    for (const node of [...ui.inner.children]) if (node !== ui.empty) node.remove();
    ui.empty.hidden = false;
    refreshPlaceholder();
    ui.prompt.focus();
  }

  function setMode(mode) {
    if (mode === state.mode) return;
    // the modes do not share a conversation: switching starts a new one, so ask first
    const shown = ui.inner.querySelector(".msg.user");
    if (shown && !window.confirm(`Switch to ${mode}? This clears the conversation.`)) return;
    state.mode = mode;
    for (const b of ui.modeButtons) {
      b.classList.toggle("active", b.dataset.mode === mode);
      b.setAttribute("aria-pressed", String(b.dataset.mode === mode)); // read by screen readers
    }
    const chat = mode === "chat";
    ui.systemField.hidden = !chat;
    ui.toolsSection.hidden = !chat; // completions take no tools
    ui.thinking.disabled = !chat;
    newChat();
  }

  // On a touch screen (a phone's keyboard) Enter adds a line and the Send button sends, as in
  // common chat apps; with a keyboard and mouse Enter sends and Shift+Enter adds a line.
  const touch = window.matchMedia("(pointer: coarse)");

  /** The prompt box's placeholder for the current mode, conversation and input device. */
  function placeholder() {
    let what = "A raw prompt to continue";
    if (state.mode === "chat") {
      what = lastRole() === "tool" ? "Send to continue after the tool results, or type a message" : "Send a message";
    }
    return touch.matches ? what : `${what} (Enter to send, Shift+Enter for a new line)`;
  }

  function refreshPlaceholder() {
    ui.prompt.placeholder = placeholder();
    autoSize();
  }

  /** Fits the prompt box's height (px, up to 220) to its text or, while empty, to its
   * placeholder (two lines on a phone: one row cut it off). */
  function autoSize() {
    const p = ui.prompt;
    const empty = !p.value;
    if (empty) p.value = p.placeholder;
    p.style.height = "auto";
    p.style.height = Math.min(p.scrollHeight + 2, 220) + "px";
    if (empty) p.value = "";
  }

  // ---------- wiring ----------

  ui.composer.addEventListener("submit", (e) => {
    e.preventDefault();
    send();
  });
  ui.prompt.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && !touch.matches) {
      e.preventDefault();
      send();
    }
  });
  ui.prompt.addEventListener("input", autoSize);
  window.addEventListener("resize", autoSize);
  ui.stopBtn.addEventListener("click", stop);
  // Escape stops the answer in flight wherever the focus is (it is in the prompt box after Send)
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && state.controller && !e.isComposing && !e.defaultPrevented) {
      e.preventDefault();
      stop();
    }
  });
  ui.newChat.addEventListener("click", newChat);
  // narrow screens only (CSS): the settings fold open under the New chat row
  ui.settingsToggle.addEventListener("click", () => {
    const open = ui.sidebar.classList.toggle("open");
    ui.settingsToggle.setAttribute("aria-expanded", String(open));
  });
  for (const b of ui.modeButtons) b.addEventListener("click", () => setMode(b.dataset.mode));

  C.watchHealth($("health-dot"), $("health-label"));
  touch.addEventListener("change", refreshPlaceholder);
  loadModels();
  refreshPlaceholder();
  ui.prompt.focus();
})();
