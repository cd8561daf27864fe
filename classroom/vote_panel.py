"""The vote panel of the students' page: one self-contained HTML/CSS/JS block.

`engine/server/routes/classroom.py` appends it to its page, so the panel and the answer panel stay
separate. The panel joins the class once (`POST /class/join`; the phone id it gets is kept in
localStorage, so a reload keeps it), polls `GET /class/vote` and shows the open round's
question and choices in the phone's language (Accept-Language, or the panel's own toggle),
marks the phone's own choice and lets it change until the round locks; when the teacher opens
the pre- or post-test it shows this phone's form. Every string from the server is written with
textContent; the panel reads only this phone's own view (the server sends nothing else).
"""

VOTE_PANEL = r"""
<section id="vp" hidden data-vps="vps0">
<div data-vps="vps1">
<strong id="vp-title"></strong>
<span><button type="button" class="vp-l" data-l="zh" data-vps="vps2">中文</button>
<button type="button" class="vp-l" data-l="en" data-vps="vps2">EN</button></span></div>
<div id="vp-q" data-vps="vps3"></div>
<div id="vp-choices"></div>
<div id="vp-status" data-vps="vps4"></div>
<div id="vp-msg" role="alert" data-vps="vps5"></div>
</section>
<style nonce="{{NONCE}}">
[data-vps="vps0"]{margin-top:18px;background:#fff;border:2px solid #2e6fbd;  border-radius:12px;padding:12px}
[data-vps="vps1"]{display:flex;justify-content:space-between;align-items:center}
[data-vps="vps2"]{width:auto;margin:0;padding:4px 8px;  font-size:14px;background:#2e6fbd}
[data-vps="vps3"]{font-size:18px;margin:10px 0;white-space:pre-wrap}
[data-vps="vps4"]{margin-top:8px;color:#444}
[data-vps="vps5"]{margin-top:6px;color:#b00020;font-weight:600}

.vp-c{display:block;width:100%;text-align:left;margin:6px 0;padding:10px;font-size:17px;
 border:2px solid #bbb;border-radius:10px;background:#f7f9fc;color:#222}
.vp-c.mine{border-color:#2e6fbd;background:#dbe8f8;font-weight:600}
.vp-c.right{border-color:#2e9e4f;background:#dff3e4}
.vp-c:disabled{color:#555}
.vp-item{margin:12px 0;padding-top:8px;border-top:1px solid #ddd}
</style>
<script nonce="{{NONCE}}">
"use strict";
(function () {
  const S = {
    zh: {vote: "课堂投票", test: "小测验", pre: "前测", post: "后测", round2: "第二次投票",
         left: "剩余 {s} 秒", mine: "你的选择已记下，锁定前可以改。", locked: "投票已锁定。",
         revealed: "答案已揭晓。", none: "你没有投票。", right: "正确答案", why: "为什么：",
         nocode: "请先输入投影上的加入码。", gone: "连不上课堂服务器，稍后自动重试。",
         answered: "已答 {n} / {t} 题，老师结束前都可以改。", measured: "引擎测得："},
    en: {vote: "Class vote", test: "Quick test", pre: "Pre-test", post: "Post-test",
         round2: "Second vote", left: "{s} s left", mine: "Your choice is in; you can change it until the round locks.",
         locked: "Voting is locked.", revealed: "The answer is out.", none: "You did not vote.",
         right: "Right answer", why: "Why: ", nocode: "Type the join code shown on the projector first.",
         gone: "Cannot reach the class server; retrying shortly.",
         answered: "{n} of {t} answered; you can change them until the teacher ends the test.",
         measured: "The engine measured: "}
  };
  const $ = (id) => document.getElementById(id);
  const nav = (navigator.language || "en").toLowerCase();
  let lang = localStorage.getItem("servelab-lang") || (nav.startsWith("zh") ? "zh" : "en");
  let phone = localStorage.getItem("servelab-vote-id") || "";
  let shown = "";
  const t = (k, v) => S[lang][k].replace(/\{(\w+)\}/g, (_, n) => (v || {})[n]);
  function code() {
    const el = $("code");
    const f = new URLSearchParams(location.hash.slice(1)).get("code");
    return (el && el.value.trim()) || f || "";
  }
  function headers() {
    const h = {"Content-Type": "application/json", "X-Phone": phone};
    if (code()) h["Authorization"] = "Bearer " + code();
    return h;
  }
  async function call(method, path, body) {
    const r = await fetch(path + (path.includes("?") ? "&" : "?") + "lang=" + lang,
      {method, headers: headers(), body: body ? JSON.stringify(body) : undefined});
    let data = null;
    try { data = await r.json(); } catch (e) {}
    if (!r.ok) {
      const err = new Error((data && data.error && data.error.message) || ("HTTP " + r.status));
      err.status = r.status; err.code = data && data.error && data.error.code;
      throw err;
    }
    return data;
  }
  async function join() {
    const d = await call("POST", "/class/join", {phone: phone || null});
    phone = d.phone;
    localStorage.setItem("servelab-vote-id", phone);
  }
  function button(text, cls, onclick) {
    const b = document.createElement("button");
    b.type = "button"; b.className = "vp-c " + cls; b.textContent = text;
    if (onclick) b.addEventListener("click", onclick); else b.disabled = true;
    return b;
  }
  function drawRound(r) {
    $("vp-title").textContent = r.number === 2 ? t("round2") : t("vote");
    $("vp-q").textContent = r.question.text;
    const box = $("vp-choices");
    box.replaceChildren();
    r.question.choices.forEach((c, i) => {
      let cls = r.mine === i ? "mine" : "";
      if (r.state === "revealed" && r.correct === i) cls += " right";
      box.appendChild(button(String.fromCharCode(65 + i) + ". " + c, cls,
        r.state === "open" ? () => vote(r.id, i) : null));
    });
    let st = r.state === "open" ? t("left", {s: Math.ceil(r.seconds_left)}) + " · " +
      (r.mine === null ? "" : t("mine")) : r.state === "locked" ? t("locked") : t("revealed");
    if (r.state === "revealed") {
      if (r.mine === null) st += " " + t("none");
      if (r.measured) st += " " + t("measured") + r.measured;
      if (r.why) st += " " + t("why") + r.why;
      else if (r.explanation) st += " " + r.explanation;
    }
    $("vp-status").textContent = st;
    $("vp").dataset.round = r.id; $("vp").dataset.state = r.state;
  }
  async function drawTest() {
    const d = await call("GET", "/class/test");
    $("vp-title").textContent = t("test") + " · " + t(d.phase);
    $("vp-q").textContent = "";
    const box = $("vp-choices");
    box.replaceChildren();
    let n = 0;
    d.items.forEach((it) => {
      const div = document.createElement("div");
      div.className = "vp-item";
      const q = document.createElement("div");
      q.textContent = (it.index + 1) + ". " + it.text;
      div.appendChild(q);
      if (it.mine !== null) n += 1;
      it.choices.forEach((c, i) => div.appendChild(button(String.fromCharCode(65 + i) + ". " + c,
        it.mine === i ? "mine" : "", () => answer(it.index, i))));
      box.appendChild(div);
    });
    $("vp-status").textContent = t("answered", {n: n, t: d.items.length});
    $("vp").dataset.round = "test-" + d.phase; $("vp").dataset.state = "test";
  }
  async function vote(rid, choice) {
    $("vp-msg").textContent = "";
    try { drawRound((await call("POST", "/class/vote", {round: rid, choice})).round); }
    catch (e) { $("vp-msg").textContent = e.message; }
  }
  async function answer(item, choice) {
    $("vp-msg").textContent = "";
    try { await call("POST", "/class/test", {item, choice}); await drawTest(); }
    catch (e) { $("vp-msg").textContent = e.message; }
  }
  async function poll() {
    try {
      if (!phone) await join();
      let d;
      try { d = await call("GET", "/class/vote"); }
      catch (e) { if (e.code === "unknown_phone") { phone = ""; await join(); return; } throw e; }
      if (d.test) { $("vp").hidden = false; const key = "t" + d.test;
        if (shown !== key) { shown = key; await drawTest(); } }
      else if (d.round) { $("vp").hidden = false; shown = ""; drawRound(d.round); }
      else { $("vp").hidden = true; shown = ""; }
      if (!$("vp").hidden && $("vp-msg").textContent === t("gone")) $("vp-msg").textContent = "";
    } catch (e) {
      if (e.status === 401) { if (!$("vp").hidden) $("vp-msg").textContent = t("nocode"); }
      else if (!$("vp").hidden) $("vp-msg").textContent = t("gone");
    }
  }
  document.querySelectorAll(".vp-l").forEach((b) => b.addEventListener("click", () => {
    lang = b.dataset.l; localStorage.setItem("servelab-lang", lang); shown = ""; poll();
  }));
  poll();
  setInterval(poll, 1000);
})();
</script>
"""
