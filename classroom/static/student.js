"use strict";
const STR = {
  en: {title: "ServeLab: ask the class engine", code: "Join code", nick: "Nickname",
    question: "Question", ask: "Ask", other: "中文",
    journey: "Your request's journey",
    pages: "Your page table (logical block → physical block)",
    tokens: "Your tokens as they arrived (step number above)",
    model: "The class engine runs a small English model (SmolLM2-135M): it shows how serving works, not how well a large model answers. Chinese questions may get weak answers.",
    seat0: "seat: -", ttft0: "first token: -", rate0: "tokens/s: -",
    seat: (s, b) => "seat " + s + ", " + b + " blocks",
    ttft: (x) => "first token: " + x + " s", rate: (x) => "tokens/s: " + x,
    needCode: "Type the join code shown on the projector.",
    wrongCode: "Wrong join code: check the code on the projector.",
    said: (n) => "the server said " + n,
    gone: "The class engine went away (the teacher may be changing a switch): ask again.",
    restarting: "The teacher changed a switch; asking again…",
    waitingEngine: "Waiting for the class engine to come back…",
    resumed: "Reconnected to your answer.",
    door: (pos, of) => "At the door: place " + (pos + 1) + " of " + of,
    why: "waited because: ",
    seated: (i, st, ws, wsec) => "Seat " + i + ", boarded at step " + st + " after " + ws +
      " steps (" + wsec + " s) at the door",
    shared: (n) => "Prefix blocks shared with others: " + n,
    pct: (p, n) => "Your first-token time is at the " + p + "th percentile of the class's " + n + " answers (lower is faster).",
    pct1: "You are the first answer in the class.",
    reasons: {seats_full: "all seats taken", token_budget: "the step's token budget was spent", kv_short: "too few free KV blocks", kv_fragmented: "KV blocks free, but not in one run", bus_running: "the static bus was still out", queued_behind: "queued behind an earlier arrival", preempted: "your blocks were taken back (preempted)", prefill_chunk: "your prompt was computed in chunks", other: "busy"},
    // the request's own wait this step (engine/waits.py): why, and what would let it in
    wait: {
      seats_full: (w) => "all " + w.seats + " seats are taken; a seat frees when an answer ends",
      token_budget: (w) => "this step's budget of " + w.budget + " tokens was spent before your turn; you go in a coming step",
      kv_short: (w) => "your prompt needs " + w.needed + " KV blocks and " + w.free + " are free; blocks free when an answer ends",
      kv_fragmented: (w) => w.free + " KV blocks are free, but the longest free run is " + w.largest_free_run + " and you need " + w.needed + " in a row (fragmentation)",
      bus_running: (w) => "the static bus boards again only when its " + w.riders_left + " riders are done",
      queued_behind: (w) => w.position + " ahead of you; the first in line waits because: " + (STR.en.reasons[w.head_code] || STR.en.reasons.other),
      preempted: (w) => "your " + w.redo_tokens + " computed tokens were dropped to let another answer go on; you recompute them when you board again",
      prefill_chunk: (w) => w.remaining + " tokens of your prompt are left for the coming steps"},
    // after the answer: its own timeline (the server's `done.timeline`, engine/waits.py)
    timeline: "Your request, step by step",
    tlNote: "Every phone draws on the same scale (milliseconds and engine steps): put yours next to a neighbour's.",
    phase: {queued: "queued", prefill: "prefill", decode: "decode", preempted: "preempted"},
    when: (a, b, n, t0, t1) => (a === b ? "step " + a : "steps " + a + "–" + b) + " (" + n + (n === 1 ? " step" : " steps") + ") · " + t0 + "–" + t1 + " ms",
    steps: (n) => n + (n === 1 ? " step" : " steps"),
    chunks: (n) => "computed in " + n + " chunks",
    redo: (rule, n) => "rule: " + (rule === "recompute" ? "recompute (the latest admitted goes)" : rule) + "; " + n + " tokens to compute again",
    ms: (x) => x >= 1000 ? (x / 1000) + " s" : x + " ms",
    // the phone's own limits (classroom/server.py OWN_WAIT_CODES): not the engine's reasons
    ownTitle: "Waiting on your own limit, not the engine: ",
    own: {own_in_flight: () => "your previous question is still being answered (one question at a time per phone)",
      own_pause: (w) => "the pause after an answer: you may ask again in " + w.left + " s"},
    ownReady: "The pause is over: you may ask again."},
  zh: {title: "ServeLab：向全班的引擎提问", code: "加入码", nick: "昵称",
    question: "问题", ask: "提问", other: "English",
    journey: "你的请求的旅程",
    pages: "你的页表（逻辑块 → 物理块）",
    tokens: "你的 token，按到达顺序（上方是步数）",
    model: "全班的引擎运行一个小型英文模型（SmolLM2-135M）：它展示推理服务如何运作，而不是大模型答得多好。中文问题的回答可能较弱。",
    seat0: "座位：-", ttft0: "首 token 延迟：-", rate0: "token/秒：-",
    seat: (s, b) => "座位 " + s + "，" + b + " 个块",
    ttft: (x) => "首 token 延迟：" + x + " 秒", rate: (x) => "token/秒：" + x,
    needCode: "请输入投影上显示的加入码。",
    wrongCode: "加入码不对：请核对投影上的加入码。",
    said: (n) => "服务器返回 " + n,
    gone: "全班的引擎暂时离开了（老师可能在切换开关）：请再问一次。",
    restarting: "老师切换了一个开关；正在重新提问……",
    waitingEngine: "正在等待全班的引擎恢复……",
    resumed: "已重新连接到你的回答。",
    door: (pos, of) => "在门口：第 " + (pos + 1) + " 位，共 " + of + " 位",
    why: "等待原因：",
    seated: (i, st, ws, wsec) => "座位 " + i + "，第 " + st + " 步上车，在门口等了 " + ws +
      " 步（" + wsec + " 秒）",
    shared: (n) => "与他人共享的前缀块：" + n,
    pct: (p, n) => "你的首 token 延迟位于全班 " + n + " 个回答的第 " + p + " 百分位（越低越快）。",
    pct1: "你是全班第一个得到回答的。",
    reasons: {seats_full: "座位已满", token_budget: "本步的 token 预算已用完", kv_short: "空闲的 KV 块不够", kv_fragmented: "KV 块有空闲，但不连成一段", bus_running: "静态批处理的大巴还没回来", queued_behind: "排在更早到的人后面", preempted: "你的块被收回了（抢占）", prefill_chunk: "你的提示词分块计算", other: "繁忙"},
    wait: {
      seats_full: (w) => "全部 " + w.seats + " 个座位都坐满了；有人答完就会空出座位",
      token_budget: (w) => "本步 " + w.budget + " 个 token 的预算在轮到你之前用完了；你在接下来的某一步上车",
      kv_short: (w) => "你的提示词需要 " + w.needed + " 个 KV 块，空闲的只有 " + w.free + " 个；有人答完就会释放块",
      kv_fragmented: (w) => "空闲的 KV 块有 " + w.free + " 个，但最长的连续空闲段只有 " + w.largest_free_run + " 个，你需要连续的 " + w.needed + " 个（碎片）",
      bus_running: (w) => "静态批处理的大巴要等车上 " + w.riders_left + " 位乘客都答完才再次上客",
      queued_behind: (w) => "你前面还有 " + w.position + " 位；排第一的在等，因为：" + (STR.zh.reasons[w.head_code] || STR.zh.reasons.other),
      preempted: (w) => "为了让别人的回答继续，你已算好的 " + w.redo_tokens + " 个 token 被丢弃；再次上车时重新计算",
      prefill_chunk: (w) => "你的提示词还剩 " + w.remaining + " 个 token，留给接下来的几步"},
    timeline: "你的请求，一步一步",
    tlNote: "每部手机都用同样的刻度（毫秒和引擎步数）：和旁边同学的比一比。",
    phase: {queued: "排队", prefill: "预填充", decode: "解码", preempted: "被抢占"},
    when: (a, b, n, t0, t1) => (a === b ? "第 " + a + " 步" : "第 " + a + "–" + b + " 步") + "（" + n + " 步）· " + t0 + "–" + t1 + " 毫秒",
    steps: (n) => n + " 步",
    chunks: (n) => "分 " + n + " 块计算",
    redo: (rule, n) => "规则：" + (rule === "recompute" ? "重算（最后入座的让出座位）" : rule) + "；要重新计算 " + n + " 个 token",
    ms: (x) => x >= 1000 ? (x / 1000) + " 秒" : x + " 毫秒",
    ownTitle: "在等你自己的限制，不是引擎：",
    own: {own_in_flight: () => "你的上一个问题还在回答中（每部手机一次只能问一个问题）",
      own_pause: (w) => "每次回答后要停一下：" + w.left + " 秒后可以再问"},
    ownReady: "停顿结束了：现在可以再问了。"}
};
const $ = (id) => document.getElementById(id);
let lang = localStorage.getItem("servelab-lang") ||
  ((navigator.language || "").toLowerCase().startsWith("zh") ? "zh" : "en");
const S = () => STR[lang];
let view = null;  // what the page shows of the current answer, redrawn on a language change
function fresh() {
  return {seat: null, ttft: null, rate: null, door: null, seated: null, pages: [],
          shared: null, pct: null, n: 0, timeline: null};
}
function applyLang() {
  document.documentElement.lang = lang === "zh" ? "zh-CN" : "en";
  document.title = S().title;
  document.querySelectorAll("[data-t]").forEach((el) => { el.textContent = S()[el.dataset.t]; });
  $("lang").textContent = S().other;
  drawStats();
  drawOwn();
}
function reasonText(r) { return S().reasons[r] || S().reasons.other; }
function drawStats() {
  const v = view || fresh();
  $("seat").textContent = v.seat ? S().seat(v.seat[0], v.seat[1]) : S().seat0;
  $("ttft").textContent = v.ttft !== null ? S().ttft(v.ttft) : S().ttft0;
  $("rate").textContent = v.rate !== null ? S().rate(v.rate) : S().rate0;
  if (!view) return;
  $("journey").hidden = false;
  const reasons = (rs) => rs.length ? " · " + S().why + [...new Set(rs.map(reasonText))].join(", ") : "";
  const w = v.door && v.door.wait;
  const now = w && S().wait[w.code] ? " · " + S().wait[w.code](w) : "";
  $("j-door").textContent = v.door ? S().door(v.door.position, v.door.of) + now + reasons(v.door.reasons) : "";
  const s = v.seated;
  $("j-seat").textContent = s ? S().seated(s.index, s.boarded_step, s.waited_steps, s.waited_s.toFixed(2)) + reasons(s.reasons) : "";
  $("j-shared").textContent = v.shared !== null ? S().shared(v.shared) : "";
  $("j-class").textContent = v.pct === null ? "" : (v.n < 1 ? S().pct1 : S().pct(v.pct, v.n));
  drawTimeline(v.timeline);
}
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
// the axis's end: the first of 1, 2, 5 x 10^k ms at or above the request's time, so two
// neighbours' phones with answers of a similar length draw on one scale
function scaleOf(ms) {
  for (let m = 100; ; m *= 10) {
    for (const f of [1, 2, 5]) { if (f * m >= ms || f * m >= 1e7) return f * m; }
  }
}
function drawTimeline(tl) {
  const box = $("timeline");
  box.hidden = !tl || !tl.length;
  $("tl-rows").textContent = ""; $("tl-scale").textContent = "";
  if (box.hidden) return;
  const max = scaleOf(tl[tl.length - 1].end_ms);
  for (const x of [0, max / 2, max]) $("tl-scale").appendChild(el("span", "", S().ms(x)));
  for (const st of tl) {
    const row = el("div", "tl-row");
    row.dataset.phase = st.phase;
    const head = el("div", "tl-head");
    const name = el("span", "tl-phase");
    name.appendChild(el("span", "tl-dot ph-" + st.phase));
    name.appendChild(document.createTextNode(S().phase[st.phase] || st.phase));
    head.appendChild(name);
    head.appendChild(el("span", "tl-when", S().when(st.from_step, st.to_step, st.steps,
      Math.round(st.start_ms), Math.round(st.end_ms))));
    row.appendChild(head);
    const track = el("div", "tl-track"), bar = el("div", "tl-bar ph-" + st.phase);
    // CSSOM, not a style attribute: the page's CSP allows no inline style
    bar.style.left = (100 * st.start_ms / max).toFixed(2) + "%";
    bar.style.width = Math.max(0.6, 100 * (st.end_ms - st.start_ms) / max).toFixed(2) + "%";
    track.appendChild(bar);
    row.appendChild(track);
    const why = el("div", "tl-why");
    const budget = st.reasons.filter((r) => r.code === "token_budget").reduce((a, r) => a + r.steps, 0);
    if (st.phase === "prefill" && st.steps - budget > 1) why.appendChild(el("span", "", S().chunks(st.steps - budget)));
    for (const r of st.reasons) {
      if (why.childNodes.length) why.appendChild(document.createTextNode(" · "));
      const text = r.code === "preempted" ? S().redo(r.fields.rule, r.fields.redo_tokens)
        : reasonText(r.code) + " × " + S().steps(r.steps);
      const c = el("span", "tl-code", text);
      c.dataset.code = r.code;
      why.appendChild(c);
    }
    if (why.childNodes.length) row.appendChild(why);
    $("tl-rows").appendChild(row);
  }
}
// the phone's own limit (a 429 whose error carries `wait`), with its countdown
let own = null, ownTimer = null;
function showOwn(wait) {
  if (ownTimer) { clearInterval(ownTimer); ownTimer = null; }
  own = wait ? {code: wait.code, until: performance.now() + 1000 * (wait.seconds_left || 0)} : null;
  if (own && own.code === "own_pause") {
    ownTimer = setInterval(() => {
      if (performance.now() >= own.until) { clearInterval(ownTimer); ownTimer = null; }
      drawOwn();
    }, 250);
  }
  drawOwn();
}
function drawOwn() {
  const box = $("own");
  box.hidden = !own;
  if (!own) return;
  box.dataset.code = own.code;
  const left = Math.max(0, Math.ceil((own.until - performance.now()) / 1000));
  if (own.code === "own_pause" && left <= 0) { box.textContent = S().ownReady; return; }
  box.textContent = S().ownTitle + S().own[own.code]({left});
}
$("lang").addEventListener("click", () => {
  lang = lang === "zh" ? "en" : "zh";
  localStorage.setItem("servelab-lang", lang);
  applyLang();
});
const frag = new URLSearchParams(location.hash.slice(1));
if (frag.get("code")) { $("code").value = frag.get("code"); }
$("nick").value = localStorage.getItem("servelab-nick") || "";
$("q").addEventListener("input", () => { $("count").textContent = $("q").value.length + " / 400"; });
let phone = localStorage.getItem("servelab-phone");
if (!phone) {
  const b = new Uint8Array(16); crypto.getRandomValues(b);
  phone = Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");
  localStorage.setItem("servelab-phone", phone);
}
function say(text) { $("msg").textContent = text; }
function note(text) { $("note").textContent = text; }
function reset(nickname, question) {
  view = fresh();
  say(""); $("answer").textContent = ""; $("asked").textContent = nickname + ": " + question;
  $("pages").textContent = ""; $("tokens").textContent = "";
  drawStats();
}
function snapshot() {
  return {view, asked: $("asked").textContent, answer: $("answer").textContent,
          pages: [...$("pages").childNodes], tokens: [...$("tokens").childNodes]};
}
function restore(b) {
  view = b.view; say("");
  $("asked").textContent = b.asked; $("answer").textContent = b.answer;
  $("pages").replaceChildren(...b.pages); $("tokens").replaceChildren(...b.tokens);
  if (!view) { $("journey").hidden = true; $("timeline").hidden = true; }
  drawStats();
}
function token(text, step, cls) {
  const el = document.createElement("span");
  el.className = "tk" + (cls ? " " + cls : "");
  if (step !== null) { const sup = document.createElement("sup"); sup.textContent = step; el.appendChild(sup); }
  el.appendChild(document.createTextNode(text));
  $("tokens").appendChild(el);
}
// one answer's events, from a fetch response; returns "done", "restart", "error" or "cut"
async function read(r, st) {
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return "cut";
    buf += dec.decode(value, {stream: true});
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const line = buf.slice(0, i); buf = buf.slice(i + 2);
      if (!line.startsWith("data: ")) continue;
      const ev = JSON.parse(line.slice(6));
      st.next = ev.i + 1;
      if (ev.type === "accepted") {
        st.rid = ev.request_id;
        localStorage.setItem("servelab-answer", JSON.stringify(
          {rid: ev.request_id, nick: st.nickname, question: st.question}));
      } else if (ev.type === "delta") {
        if (st.first === null && ev.text) {
          st.first = performance.now();
          view.ttft = ((st.first - st.sent) / 1000).toFixed(2);
        }
        $("answer").textContent += ev.text;
        if (ev.text) token(ev.text, ev.step, "");
      } else if (ev.type === "seat") {
        view.seat = [ev.seat, ev.blocks];
      } else if (ev.type === "journey") {
        if (ev.door) view.door = ev.door;
        if (ev.seat) { view.seated = ev.seat; view.door = null; }
        if (ev.blocks) {
          const p = $("pages");
          for (let k = p.children.length; k < ev.blocks.length; k++) {
            const el = document.createElement("span");
            el.textContent = k + " → " + ev.blocks[k];
            p.appendChild(el);
          }
        }
        if (ev.shared_blocks !== undefined) view.shared = ev.shared_blocks;
        if (ev.drafts) {
          for (const d of ev.drafts) token(d.text, null, d.accepted ? "ok" : "no");
        }
      } else if (ev.type === "done") {
        const s = (performance.now() - (st.first || st.sent)) / 1000;
        if (ev.tokens > 1 && s > 0) view.rate = ((ev.tokens - 1) / s).toFixed(1);
        if (st.resumed && ev.server_ttft_s) view.ttft = ev.server_ttft_s.toFixed(2);
        view.timeline = ev.timeline || null;
        if (ev.ttft_percentile !== null && ev.ttft_percentile !== undefined) {
          view.pct = Math.round(ev.ttft_percentile); view.n = ev.class_answers;
        } else { view.pct = 0; view.n = 0; }
        drawStats();
        return "done";
      } else if (ev.type === "error") {
        drawStats();
        if (ev.code === "engine_restarting") return "restart";
        say(ev.message);
        return "error";
      }
      drawStats();
    }
  }
}
const sleep = (ms) => new Promise((res) => setTimeout(res, ms));
let phoneToken = sessionStorage.getItem("servelab-phone");
async function joinOnce(code) {
  // the server's token for this phone: its limits count by it, not by the nickname
  if (phoneToken) return;
  try {
    const r = await fetch("/class/token?lang=" + lang, {method: "POST", headers: {"Authorization": "Bearer " + code}});
    if (r.ok) { phoneToken = (await r.json()).phone; sessionStorage.setItem("servelab-phone", phoneToken); }
  } catch (e) {}
}
async function ask() {
  const code = $("code").value.trim(), nickname = $("nick").value, question = $("q").value;
  note("");
  if (!code) { say(S().needCode); return; }
  localStorage.setItem("servelab-nick", nickname);
  if (window.servelabNickname) window.servelabNickname(nickname).catch(() => {});
  showOwn(null);
  const before = snapshot();  // the last answer, back on screen if this one is refused as too soon
  reset(nickname, question);
  $("ask").disabled = true;
  try {
    for (let attempt = 0; attempt < 20; attempt++) {
      const st = {nickname, question, sent: performance.now(), first: null, next: 0, rid: null};
      let outcome;
      try {
        await joinOnce(code);
        const headers = {"Content-Type": "application/json", "Authorization": "Bearer " + code};
        if (phoneToken) headers["X-ServeLab-Phone"] = phoneToken;
        const r = await fetch("/class/ask?lang=" + lang, {method: "POST", headers,
          body: JSON.stringify({nickname, question, phone})});
        if (!r.ok) {
          let m = S().said(r.status), wait = null;
          try { const err = (await r.json()).error; m = err.message; wait = err.wait || null; } catch (e) {}
          if (r.status === 503 && attempt < 19) { note(S().waitingEngine); await sleep(1000); continue; }
          // the phone's own limit: a wait of its own, said apart from the engine's reasons
          // (the last answer comes back on screen)
          if (r.status === 429 && wait && S().own[wait.code]) { restore(before); showOwn(wait); return; }
          say(r.status === 401 ? S().wrongCode : m);  // m: the server's message, in `lang`
          return;
        }
        outcome = await read(r, st);
        if (outcome === "cut" && st.rid) outcome = await follow(code, st);
      } catch (e) {
        outcome = st.rid ? await follow(code, st).catch(() => "gone") : "gone";
      }
      if (outcome === "restart") {
        note(S().restarting);
        reset(nickname, question);
        await sleep(500);
        continue;
      }
      if (outcome === "gone") {
        note(S().waitingEngine);
        await sleep(1500);
        reset(nickname, question);
        continue;
      }
      if (outcome === "done") note("");
      return;
    }
    say(S().gone);
  } finally {
    $("ask").disabled = false;
  }
}
// reattach to an answer by its id (a dropped connection, or a reload), from event st.next
async function follow(code, st) {
  for (let tries = 0; tries < 5; tries++) {
    const r = await fetch("/class/answer/" + encodeURIComponent(st.rid) + "?start=" + st.next + "&lang=" + lang,
      {headers: {"Authorization": "Bearer " + code, "X-Phone-Secret": phone}});
    if (r.status === 404) { localStorage.removeItem("servelab-answer"); return "error"; }
    if (!r.ok) { await sleep(1000); continue; }
    const out = await read(r, st);
    if (out !== "cut") return out;
  }
  return "gone";
}
async function resume() {
  let saved = null;
  try { saved = JSON.parse(localStorage.getItem("servelab-answer") || "null"); } catch (e) {}
  const code = $("code").value.trim();
  if (!saved || !saved.rid || !code) return;
  $("q").value = saved.question;
  $("count").textContent = saved.question.length + " / 400";
  reset(saved.nick, saved.question);
  const st = {nickname: saved.nick, question: saved.question, sent: performance.now(),
              first: null, next: 0, rid: saved.rid, resumed: true};
  $("ask").disabled = true;
  try {
    const out = await follow(code, st);
    if (out === "error" && st.next === 0) { view = null; $("asked").textContent = ""; drawStats(); }
    else note(S().resumed);
    if (out === "restart") { $("ask").disabled = false; await ask(); }
  } catch (e) {
    note("");
  } finally {
    $("ask").disabled = false;
  }
}
$("ask").addEventListener("click", ask);
applyLang();
resume();
