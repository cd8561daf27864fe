"""UI strings in Chinese and English, and the language the current browser session reads.

`get_lang()` reads `st.session_state["lang"]`; when it is unset, a browser locale starting with
"en" gives English and anything else Chinese (the chapter's language). `t(key, **fmt)` looks a
string up in `STRINGS` for that language. `language_selector()` draws the sidebar radio bound to
`st.session_state["lang"]`. Lesson text itself lives in `lessons/<lang>/`, not here.
"""

from __future__ import annotations

import streamlit as st
from streamlit.errors import StreamlitDuplicateElementId, StreamlitDuplicateElementKey

from lessons.figures import fill_figures

LANGS = ("zh", "en")
LANG_LABELS = {"zh": "中文", "en": "English"}
KEPT_LANG = "_keep_lang"

# key -> {"zh": ..., "en": ...}. Keys are dotted by page; add yours, keep both languages.
STRINGS: dict[str, dict[str, str]] = {
    "app.title": {"zh": "ServeLab 推理服务实验室", "en": "ServeLab: an LLM serving lab"},
    "lang.label": {"zh": "语言 / Language", "en": "Language / 语言"},
    # pages
    "page.plan": {"zh": "课堂计划", "en": "Class plan"},
    "page.summary": {"zh": "本章小结", "en": "Summary"},
    "page.calculators": {"zh": "小计算器", "en": "Calculators"},
    "page.home": {"zh": "首页：三处漏洞", "en": "Home: three leaks"},
    "page.batching": {"zh": "连续批处理", "en": "Continuous batching"},
    "page.paging": {"zh": "分页 KV 缓存", "en": "Paged KV cache"},
    "page.speculation": {"zh": "投机解码", "en": "Speculative decoding"},
    "page.dashboard": {"zh": "仪表盘", "en": "Dashboard"},
    "page.beyond": {"zh": "三招之外", "en": "Beyond the three"},
    "page.quiz": {"zh": "自测", "en": "Self-test"},
    "page.glossary": {"zh": "术语表", "en": "Glossary"},
    "page.classroom": {"zh": "课堂：全班共用一台引擎", "en": "Classroom: one engine for all"},
    # switches and their values
    "switch.batching": {"zh": "批处理", "en": "Batching"},
    "switch.batching.static": {"zh": "静态（旅游大巴）", "en": "static (tour bus)"},
    "switch.batching.continuous": {"zh": "连续（地铁）", "en": "continuous (subway)"},
    "switch.kv_layout": {"zh": "KV 布局", "en": "KV layout"},
    "switch.kv_layout.contiguous": {"zh": "整块预留（宴会厅）", "en": "contiguous (banquet hall)"},
    "switch.kv_layout.paged": {"zh": "分页", "en": "paged"},
    "switch.spec": {"zh": "投机解码", "en": "Speculation"},
    "switch.spec.off": {"zh": "关闭", "en": "off"},
    "switch.spec.ngram": {"zh": "n-gram 查找", "en": "n-gram lookup"},
    "switch.spec.draft": {"zh": "草稿模型", "en": "draft model"},
    "switch.spec.eagle": {"zh": "EAGLE 学徒", "en": "EAGLE apprentice"},
    "side.eagle_missing": {"zh": "EAGLE 学徒（在目标模型特征上训练的一层草稿头）还没训练。在终端运行 "
                                 "`{cmd}`（2 核 CPU 约 15 分钟），然后刷新页面。",
                           "en": "The EAGLE apprentice (a one-layer draft head on the target's "
                                 "features) is not trained yet. Build it with `{cmd}` in a "
                                 "terminal (about 15 minutes on 2 CPU cores), then reload."},
    # lessons
    "lesson.try_links": {"zh": "一键设置开关：", "en": "Set the switches in one click:"},
    "lesson.step": {"zh": "第 {n} 步", "en": "Step {n}"},
    "lesson.live_only_here": {
        "zh": "本页没有实时仪表盘；上面的链接会带你去能看到引擎实时运行的页面。",
        "en": "This page has no live dashboard; the links above open pages that have one.",
    },
    # quiz
    "quiz.intro": {
        "zh": "前五题对应本章的「动手自测」，其余是拓展题。答完看解析，再点链接到实时页面验证。",
        "en": "The first five are the chapter's own self-test; the rest go further. "
        "Read the explanation, then open the linked page and check it live.",
    },
    "quiz.chapter_set": {"zh": "本章自测", "en": "The chapter's self-test"},
    "quiz.extra_set": {"zh": "拓展题", "en": "Going further"},
    "quiz.score_chapter": {"zh": "本章自测得分", "en": "Chapter score"},
    "quiz.score_extra": {"zh": "拓展题得分", "en": "Extra score"},
    "quiz.choose": {"zh": "选一个答案", "en": "Pick one answer"},
    "quiz.submit": {"zh": "提交", "en": "Submit"},
    "quiz.pick_first": {"zh": "请先选一个选项再提交。", "en": "Pick a choice before submitting."},
    "quiz.correct": {"zh": "✅ 答对了。", "en": "✅ Correct."},
    "quiz.incorrect": {"zh": "❌ 不对。", "en": "❌ Not quite."},
    "quiz.your_answer": {"zh": "你的答案", "en": "your answer"},
    "quiz.right_answer": {"zh": "正确答案", "en": "the right answer"},
    "quiz.why_not": {"zh": "这个选项错在：", "en": "Why not this one:"},
    "quiz.tests_elsewhere": {"zh": "课上的前测和后测在手机上做，题目不在这一页，也不会出现在课上的投票里；"
                                   "这一页的题和解析尽管看。",
                             "en": "The class's pre-test and post-test are taken on phones; "
                                   "their questions are not on this page and never open as a "
                                   "class vote. These questions and their answers are yours "
                                   "to study."},
    "quiz.retry": {"zh": "重答这题", "en": "Retry this question"},
    "quiz.reset_all": {"zh": "全部重来", "en": "Reset all"},
    "quiz.try_demo": {"zh": "到实时页面看一看", "en": "See it live"},
    "quiz.open_set": {"zh": "讨论题：本章的五个问题，开放作答", "en": "For discussion: the chapter's five questions, open-ended"},
    "quiz.open_intro": {"zh": "没有标准选项，说出理由，再到实时页面找证据。",
                        "en": "No choices to pick from: argue your answer, then look for the "
                              "evidence on the live pages."},
    # glossary
    "glossary.intro": {
        "zh": "本章和本应用用到的术语，中英对照。",
        "en": "The terms this chapter and this app use, in Chinese and English.",
    },
    "glossary.search": {"zh": "搜索术语", "en": "Search terms"},
    "glossary.search_help": {
        "zh": "中文或英文都可以，例如 KV、吞吐、prefill",
        "en": "Chinese or English, e.g. KV, throughput, 预填充",
    },
    "glossary.count": {
        "zh": "显示 {shown} / {total} 个术语",
        "en": "Showing {shown} / {total} terms",
    },
    "glossary.no_match": {"zh": "没有匹配的术语。", "en": "No term matches."},
    "glossary.see_page": {"zh": "相关页面", "en": "Related page"},
    # ---- the classroom app: shell and sidebar
    "nav.start": {"zh": "开始", "en": "Start"},
    "nav.leaks": {"zh": "三处漏洞", "en": "The three leaks"},
    "nav.measure": {"zh": "测量", "en": "Measure"},
    "nav.check": {"zh": "自测", "en": "Check yourself"},
    "nav.class": {"zh": "课堂", "en": "Class"},
    "side.switches": {"zh": "三个开关", "en": "The three switches"},
    "side.k": {"zh": "每步草稿 token 数 k", "en": "Drafted tokens per step (k)"},
    "side.k.help": {"zh": "每一步先猜 k 个 token，再由目标模型一次验证。",
                    "en": "Each step drafts k tokens; the target verifies them in one pass."},
    "side.adaptive": {"zh": "自适应 k（每步按实测选 k）", "en": "Adaptive k (choose k each step)"},
    "side.adaptive.help": {
        "zh": "每一步在 0 到 k 之间选一个草稿长度：按实测的每步耗时和接受率，选预计每秒产出最多的那个"
              "（SmartSpec 的做法）。0 表示这一步不投机。",
        "en": "Each step drafts between 0 and k tokens: the length the measured step times and "
              "acceptance say gives the most tokens per second (as SmartSpec does). 0 means no "
              "speculation this step."},
    "side.lookup_first": {"zh": "先查提示词（n-gram 在前，模型补位）",
                          "en": "Prompt lookup first (the model fills in)"},
    "side.confidence": {"zh": "学徒的把握下限（低于它就不起草）",
                        "en": "Apprentice's confidence stop"},
    "side.confidence.help": {
        "zh": "EAGLE 学徒只起草它自己给出概率不低于这个值的 token，遇到第一个没把握的就停下，所以有的步"
              "一个也不起草。调高：a 升高，但每趟验证产出的 token 变少。0 表示总是起草满 k 个。",
        "en": "The EAGLE apprentice drafts only tokens it gives at least this probability and "
              "stops before the first it doubts, so a step may draft nothing. Higher: a rises, "
              "but each verification yields fewer tokens. 0 always drafts k."},
    "side.lookup_first.help": {
        "zh": "每一步先在上下文里找和结尾相同的 n-gram：找到了就照抄它后面的 token 当草稿（不花算力），"
              "找不到才让草稿模型来猜。抄写型的回答（改代码、转格式）多数步都能照抄。",
        "en": "Each step first looks for the text's last n-gram earlier in its context: where "
              "it is found, the tokens that followed are the draft (no compute); only where "
              "it is not does the draft model guess. Answers that copy (code edits, format "
              "changes) find a match on most steps."},
    "side.sizes": {"zh": "规模与采样", "en": "Sizes and sampling"},
    "side.seats": {"zh": "座位数（max_num_seqs）", "en": "Seats (max_num_seqs)"},
    "side.seats.help": {"zh": "一步里最多同时计算的请求数。",
                        "en": "The most requests one step computes together."},
    "side.blocks": {"zh": "KV 预算（块）", "en": "KV budget (blocks)"},
    "side.blocks.help": {"zh": "KV 缓存池里的物理块数；两种布局用同一个预算。",
                         "en": "Physical blocks in the KV pool; both layouts get the same budget."},
    "side.block_size": {"zh": "块大小（token）", "en": "Block size (tokens)"},
    "side.block_size.help": {
        "zh": "每块能放几个 token 的 K/V。每个请求的最后一块平均空着半块（内部碎片）："
              "块大小 8 时约 4 个空位，16 时约 8 个；块越小，块表越长。",
        "en": "How many tokens' K/V one block holds. Each request's last block is half empty on "
              "average (internal waste): about 4 empty slots with 8, about 8 with 16. Smaller "
              "blocks make longer block tables."},
    "side.prefix": {"zh": "共享提示词前缀", "en": "Share prompt prefixes"},
    "side.prefix.help": {"zh": "分页布局下，从开头到某个写满的块为止提示词完全相同，这个块就只存一份"
                               "（前缀缓存：块的键串着前一块的键）。",
                         "en": "Paged layout only: a full prompt block is stored once for every "
                               "request whose prompt is identical from the start up to it "
                               "(prefix caching: a block's key chains its parent's)."},
    "side.temperature": {"zh": "温度", "en": "Temperature"},
    "side.temperature.help": {"zh": "0 = 贪心；大于 0 时按概率采样，投机解码走拒绝采样。",
                              "en": "0 = greedy; above 0 tokens are sampled and speculation "
                                    "uses rejection sampling."},
    "side.model": {"zh": "模型", "en": "Model"},
    "side.requests": {"zh": "请求数", "en": "Requests"},
    "side.requests.help": {"zh": "工作负载里的请求个数，第 0 步全部到达。",
                           "en": "How many requests of the workload; all arrive at step 0."},
    "side.samples": {"zh": "每个提示词采样几个回答（n）", "en": "Answers per prompt (n)"},
    "side.samples.help": {
        "zh": "并行采样（PagedAttention 论文 4.4 节）：n 个回答共用提示词的 KV 块（引用计数），"
              "最后一个没写满的块在各自第一次写入时复制一份（写时复制）。温度为 0 时 n 个回答"
              "相同；调高温度，它们就各走各的。投机解码不为 n > 1 的请求起草。",
        "en": "Parallel sampling (PagedAttention paper, section 4.4): the n answers share the "
              "prompt's KV blocks (reference counts); the last, partly written block is copied "
              "when each answer first writes to it (copy-on-write). At temperature 0 the n "
              "answers are the same; raise the temperature and they go their own ways. "
              "Speculation drafts nothing for a request with n > 1."},
    "side.workload": {"zh": "工作负载", "en": "Workload"},
    "workload.longtail": {"zh": "长尾：多数短答、少数长答", "en": "long tail: mostly short answers"},
    "workload.uniform": {"zh": "等长：所有回答一样长", "en": "uniform: equal answers"},
    "workload.shared-prefix": {"zh": "共享前缀：同一段系统提示词", "en": "shared prefix: one system prompt"},
    "workload.grounded": {"zh": "照抄型：回答复用提示词", "en": "grounded: answers copy the prompt"},
    "workload.open": {"zh": "开放式创作", "en": "open-ended writing"},
    "side.custom": {"zh": "加入我自己的提示词", "en": "Add my own prompt"},
    "side.custom.prompt": {"zh": "提示词", "en": "Prompt"},
    "side.custom.placeholder": {"zh": "例如：用一句话解释什么是 KV 缓存。",
                                "en": "e.g. Explain the KV cache in one sentence."},
    "side.custom.max_tokens": {"zh": "最多生成 token 数", "en": "Max new tokens"},
    "side.custom.add": {"zh": "加入队列", "en": "Add to the queue"},
    "side.custom.bad": {"zh": "这个提示词不能加入：{msg}", "en": "This prompt cannot be added: {msg}"},
    "side.custom.added": {"zh": "已加入，请求编号 {rid}。", "en": "Added as request {rid}."},
    "side.step": {"zh": "单步", "en": "Step"},
    "side.play": {"zh": "播放", "en": "Play"},
    "side.pause": {"zh": "暂停", "en": "Pause"},
    "side.reset": {"zh": "重置", "en": "Reset"},
    "side.speed": {"zh": "播放间隔", "en": "Play interval"},
    "side.speed.value": {"zh": "{s} 秒/步", "en": "{s} s/step"},
    # ---- live pages, shared
    "live.loading_model": {"zh": "正在加载模型（只在服务器首次启动时）：",
                           "en": "Loading the model (first start of the server only):"},
    "live.preparing": {"zh": "正在准备引擎并重放到当前步……",
                       "en": "Preparing the engine and replaying to this step…"},
    "shell.own_engine": {"zh": "这一页驱动的是全班共用的那台服务器；单人实验的开关和「单步 / 播放」在其他页面。",
                         "en": "This page drives the class's shared server; the single-user "
                               "switches and Step / Play are on the other pages."},
    "live.build_error": {"zh": "引擎无法按这些设置建立：{msg}",
                         "en": "The engine cannot be built with these settings: {msg}"},
    "live.step": {"zh": "第 {n} 步", "en": "Step {n}"},
    "live.all_done": {"zh": "所有请求都已完成；按「重置」重新开始。",
                      "en": "Every request is done; press Reset to start over."},
    "live.playing": {"zh": "播放中……", "en": "Playing…"},
    "live.press_step": {"zh": "{n} 个请求在门口排队；按侧边栏的「单步」或「播放」开始。",
                        "en": "{n} requests wait at the door; press Step or Play in the sidebar."},
    "live.sidebar_choice": {"zh": "侧边栏", "en": "sidebar"},
    # ---- seats (leak 1)
    "seats.seat": {"zh": "座位 {n}", "en": "seat {n}"},
    "seats.tokens": {"zh": "已出 {n} 个", "en": "{n} tok out"},
    "seats.state": {"zh": "状态", "en": "state"},
    "seats.state.running": {"zh": "生成中", "en": "generating"},
    "seats.state.prefill": {"zh": "处理提示词", "en": "reading prompt"},
    "seats.state.idle-finished": {"zh": "已完成仍占座", "en": "done, seat held"},
    "seats.state.empty": {"zh": "空座", "en": "empty"},
    "seats.queue": {"zh": "门口排队（{n}）：", "en": "Queue at the door ({n}):"},
    "seats.more": {"zh": "还有 {n} 个", "en": "{n} more"},
    "seats.blocked": {"zh": "队首为何进不来", "en": "Why the head of the queue waits"},
    "seats.reason.seats": {"zh": "座位全满", "en": "all seats taken"},
    "seats.reason.static": {"zh": "静态批处理：要等所有座位都空了，大巴才重新上客",
                            "en": "static batching: the bus boards only when every seat is empty"},
    "seats.reason.budget": {"zh": "这一步的 token 预算已用完", "en": "this step's token budget is used up"},
    # ---- why a request waits (engine/waits.py): a short name and a sentence with its counts
    "wait.seats_full": {"zh": "座位已满", "en": "all seats taken"},
    "wait.seats_full.why": {"zh": "全部 {seats} 个座位都坐满了；有人答完就会空出座位",
                            "en": "all {seats} seats are taken; a seat frees when an answer ends"},
    "wait.token_budget": {"zh": "本步预算已用完", "en": "step budget spent"},
    "wait.token_budget.why": {"zh": "本步 {budget} 个 token 的预算在轮到它之前用完了",
                              "en": "this step's budget of {budget} tokens was spent before its turn"},
    "wait.kv_short": {"zh": "KV 块不够", "en": "too few KV blocks"},
    "wait.kv_short.why": {"zh": "需要 {needed} 个 KV 块，空闲的只有 {free} 个",
                          "en": "needs {needed} KV blocks; {free} are free"},
    "wait.kv_fragmented": {"zh": "KV 碎片", "en": "KV fragmented"},
    "wait.kv_fragmented.why": {
        "zh": "空闲 {free} 个 KV 块，但最长的连续空闲段只有 {largest_free_run} 个，它要连续的 {needed} 个",
        "en": "{free} KV blocks free, but the longest free run is {largest_free_run} and it "
              "needs {needed} in a row"},
    "wait.bus_running": {"zh": "大巴未回", "en": "bus still out"},
    "wait.bus_running.why": {"zh": "静态批处理：车上 {riders_left} 位乘客都答完，大巴才再次上客",
                             "en": "static batching: the bus boards again when its {riders_left} "
                                   "riders are done"},
    "wait.queued_behind": {"zh": "排在后面", "en": "queued behind"},
    "wait.queued_behind.why": {"zh": "前面还有 {position} 位；队首在等", "en": "{position} ahead; the head waits"},
    "wait.preempted": {"zh": "被抢占", "en": "preempted"},
    "wait.preempted.why": {"zh": "它的块被收回，已算好的 {redo_tokens} 个 token 要重算",
                           "en": "its blocks were taken back; it recomputes {redo_tokens} tokens"},
    "wait.prefill_chunk": {"zh": "分块预填充", "en": "prefill chunk"},
    "wait.prefill_chunk.why": {"zh": "提示词分块计算：还剩 {remaining} 个 token",
                               "en": "its prompt is computed in chunks: {remaining} tokens left"},
    "seats.waits_chart": {"zh": "每一步，为什么在等", "en": "Why requests wait, step by step"},
    "seats.waits_chart.help": {
        "zh": "每一步里没有前进（或只算了一块提示词）的请求，按引擎给出的原因计数。",
        "en": "Each step's requests that did not advance (or computed only a chunk of their "
              "prompt), counted by the reason the engine gave."},
    "seats.waits_axis": {"zh": "请求数", "en": "requests"},
    "seats.waits_reason": {"zh": "原因", "en": "reason"},
    "prefix.header": {"zh": "前缀缓存：这一步新上车的 {n} 个请求各命中了多少块",
                      "en": "Prefix cache: how many blocks each of this step's {n} new requests found"},
    "prefix.line": {"zh": "{rid} 的前缀缓存：{full} 个完整提示块中命中 {hit} 个；{why}",
                    "en": "{rid}'s prefix cache: {hit} of its {full} full prompt blocks hit; {why}"},
    "prefix.why.new": {"zh": "从第 {token} 个 token 起，还没有人算过同样的前缀",
                       "en": "from token {token} on, nobody has computed this prefix yet"},
    "prefix.why.differs": {"zh": "缓存里的块在第 {token} 个 token 处与它不同",
                           "en": "the cached block differs from it at token {token}"},
    "prefix.why.evicted": {"zh": "第 {token} 个 token 起的块曾在缓存里，但已被挤出，给了别的请求",
                           "en": "the block from token {token} was cached but has been evicted "
                                 "for another request"},
    "prefix.why.short": {"zh": "剩下的 {left} 个 token 不满一个块，块满了才能缓存",
                         "en": "the last {left} tokens fill less than a block, and only full "
                               "blocks are cached"},
    "cls.hidden_name": {"zh": "（已隐藏）", "en": "(hidden)"},
    "seats.admitted": {"zh": "上车", "en": "boarded"},
    "seats.finished": {"zh": "完成", "en": "finished"},
    "seats.preempted": {"zh": "被请下车（抢占）", "en": "preempted"},
    "seats.axis_step": {"zh": "步", "en": "step"},
    "seats.axis_seat": {"zh": "座位", "en": "seat"},
    "seats.rider": {"zh": "乘客", "en": "rider"},
    "batching.useful_seat_steps": {"zh": "有效座位·步", "en": "Useful seat-steps"},
    "batching.useful_seat_steps.help": {
        "zh": "到目前为止，所有座位·步里真正在算活请求的比例。",
        "en": "So far, the share of all seat-steps that computed a live request."},
    "batching.totals": {"zh": "共 {steps} 步、{tokens} 个 token；已完成仍占座的座位·步：{wasted}",
                        "en": "{steps} steps, {tokens} tokens; seat-steps held by finished "
                              "riders: {wasted}"},
    "batching.timeline": {"zh": "座位 × 步 时间线", "en": "Seats × steps timeline"},
    "batching.timeline.help": {
        "zh": "每一格是一个座位在一步里的状态；红色格子被计算了，却不为任何人产出 token。",
        "en": "Each cell is one seat in one step; red cells were computed but produced a token "
              "for nobody."},
    # ---- KV map (leak 2)
    "kv.state.free": {"zh": "空闲", "en": "free"},
    "kv.state.used": {"zh": "已用", "en": "used"},
    "kv.state.reserved": {"zh": "预留未用", "en": "reserved, unused"},
    "kv.state.shared": {"zh": "共享", "en": "shared"},
    "kv.state.cached": {"zh": "缓存待复用", "en": "cached for reuse"},
    "kv.state.?": {"zh": "未知", "en": "unknown"},
    "kv.legend.used": {"zh": "写满的块（颜色 = 所属请求）", "en": "full block (colour = owner)"},
    "kv.legend.partial": {"zh": "部分写入（浅色 = 已分配未写）",
                          "en": "partly written (pale = allocated, unwritten)"},
    "kv.legend.reserved": {"zh": "预留未用", "en": "reserved, unused"},
    "kv.legend.free": {"zh": "空闲", "en": "free"},
    "kv.legend.shared": {"zh": "多请求共享（×引用数）", "en": "shared (× references)"},
    "kv.legend.cached": {"zh": "无主缓存（前缀待复用）", "en": "cached, no owner (prefix for reuse)"},
    "kv.legend.copied": {"zh": "本步写时复制（⧉源块）", "en": "copied on write this step (⧉ source)"},
    "kv.refs": {"zh": "引用数 {n}", "en": "{n} references"},
    "kv.copied_from": {"zh": "本步从块 #{src} 写时复制而来", "en": "copied on write from #{src} this step"},
    "kv.fork.line": {"zh": "**{rid}** 的 n={n} 个采样（{samples}）在 fork 后共享提示词的块：{shared}。",
                     "en": "**{rid}**'s n={n} samples ({samples}) share the prompt's blocks since "
                           "their fork: {shared}."},
    "kv.fork.copied": {"zh": "本步写时复制：{copies}（某个采样要写入兄弟采样仍在引用的块，先复制一份）。",
                       "en": "Copied on write this step: {copies} (a sample was about to write "
                             "into a block its siblings still hold, so it got its own copy)."},
    "kv.col.logical": {"zh": "逻辑块", "en": "logical block"},
    "kv.col.physical": {"zh": "物理块", "en": "physical block"},
    "kv.col.tokens": {"zh": "已写 token", "en": "tokens held"},
    "kv.col.state": {"zh": "状态", "en": "state"},
    "kv.col.shared_with": {"zh": "与谁共享", "en": "shared with"},
    "paging.budget": {
        "zh": "两边同一预算：{blocks} 块 × {bs} = {slots} 个槽位；整块预留时，每个请求一进门就占下"
              "「提示词 + 它的 max_tokens」那么长的一段连续块（最多 {per} 块，max_model_len = {mml}）。",
        "en": "Same budget on both sides: {blocks} blocks × {bs} = {slots} slots; a contiguous "
              "layout reserves, at admission, one run for each request's prompt + its own "
              "max_tokens (at most {per} blocks: max_model_len = {mml})."},
    "paging.select": {"zh": "查看哪个请求的页表", "en": "Page table of request"},
    "paging.select.help": {"zh": "它的块在图中用黄框标出。",
                           "en": "Its blocks are outlined in yellow on the map."},
    "paging.concurrency": {"zh": "同时运行", "en": "Running at once"},
    "paging.concurrency.help": {"zh": "此刻持有 KV 的请求数。",
                                "en": "Requests holding KV right now."},
    "paging.free": {"zh": "空闲合计（槽位）", "en": "Free in total (slots)"},
    "paging.largest_run": {"zh": "最长连续空闲（槽位）", "en": "Largest free run (slots)"},
    "paging.largest_run.help": {
        "zh": "整块预留需要一段足够长的连续空闲；合计够而最长段不够，就是外部碎片。",
        "en": "A contiguous reservation needs one long enough run; enough in total but no "
              "run long enough is external fragmentation."},
    "paging.frag_wait": {
        "zh": "外部碎片，就在此刻：空闲合计 {free} 个槽位，最长的一段连续空闲只有 {run} 个槽位，"
              "队首请求的整块预留放不下，只好等。（引擎：{reason}）",
        "en": "External fragmentation, right now: {free} slots are free in total, but the "
              "longest free run holds {run}, too short for the head of the queue's contiguous "
              "reservation, so it waits. (Engine: {reason})"},
    "paging.shared": {"zh": "共享块", "en": "Shared blocks"},
    "paging.shared.help": {"zh": "被多个请求的页表同时指向的物理块（前缀共享）。",
                           "en": "Physical blocks in several requests' page tables (prefix "
                                 "sharing)."},
    "paging.page_table": {"zh": "{rid} 的页表：逻辑块 → 物理块",
                          "en": "Page table of {rid}: logical block → physical block"},
    "paging.not_running": {"zh": "{rid} 在这一边此刻不持有 KV。",
                           "en": "{rid} holds no KV on this side right now."},
    # ---- speculation (leak 3)
    "spec.off_note": {"zh": "侧边栏的投机解码是关闭的；本页仍用 n-gram 演示，并与关闭时对比。",
                      "en": "Speculation is off in the sidebar; this page still shows n-gram, "
                            "compared with speculation off."},
    "spec.running": {"zh": "投机方式：{method}，k = {k}；右侧对照为同一负载、不投机。",
                     "en": "Speculating with {method}, k = {k}; compared with the same "
                           "workload without speculation."},
    "spec.lookup_share": {"zh": "先查提示词：已验证的 {total} 份草稿里，{lookup} 份是照抄上下文得来的，其余由模型猜。",
                          "en": "Prompt lookup first: of {total} verified drafts, {lookup} were "
                                "copied from the context by lookup, the rest guessed by the "
                                "model."},
    "spec.adaptive_waiting": {"zh": "自适应 k：还没有请求在解码，第一次选择在预填充之后。",
                              "en": "Adaptive k: no request is decoding yet; the first choice "
                                    "comes after prefill."},
    "spec.adaptive_now": {"zh": "第 {step} 步：引擎选了 k = {k}（预计每秒产出最多的草稿长度）。",
                          "en": "Step {step}: the engine chose k = {k}, the draft length it "
                                "expects to give the most tokens per second."},
    "spec.adaptive_explored": {
        "zh": "第 {step} 步：试探一步，用了 k = {k}（当前最佳估计是 k = {best}）；"
              "每 {every} 步换一个 k 试一次，好让每个 k 的耗时都有实测值。",
        "en": "Step {step}: a measuring detour at k = {k} (the best estimate is k = {best}); "
              "one step in {every} tries another k so that each k's cost is measured."},
    "spec.adaptive_title": {"zh": "这一步各 k 预计的 token/秒",
                            "en": "Expected tokens/s by k, this step"},
    "spec.adaptive_y": {"zh": "预计 token/秒", "en": "expected tokens/s"},
    "spec.k_history_title": {"zh": "每步的 k（橙点：试探的步）",
                             "en": "k at each step (orange: detours)"},
    "spec.step_axis": {"zh": "步", "en": "step"},
    "spec.adaptive_caption": {
        "zh": "预计每秒 token 数 = B·E(k) / (T(n) + k·d)：E(k) 是每个请求一步预计产出的 token 数"
              "（来自实测的逐位置接受率），T(n) 是实测的一步 n 个 token 的耗时，d 是草稿每个位置的"
              "实测耗时。验证几乎免费时（显存带宽瓶颈）k 取满；每一行都要算力时（批很大，或 CPU）"
              "k 降到 0，这一步就不投机。无论选哪个 k：在这台 CPU 上贪心输出的 token 不变（引擎的 CPU "
              "算子对每一行的计算与批的形状无关；bf16 的 GPU 算子上两个几乎并列的 token 可能对调，"
              "那是数值问题），采样时输出的分布不变。",
        "en": "Expected tokens/s = B·E(k) / (T(n) + k·d): E(k) is the tokens a request emits per "
              "step (from the measured acceptance at each position), T(n) the measured time of a "
              "step of n tokens, d the measured drafting time per position. When verifying is "
              "nearly free (memory-bound) k goes to the top; when every row costs compute (a "
              "big batch, or a CPU) k falls to 0 and the step does not speculate. Whatever k it "
              "picks, greedy output on this CPU keeps the same tokens (the engine's CPU kernels "
              "compute each row the same whatever the batch's shape; with bf16 GPU kernels two "
              "near-tied tokens can swap: numerics, not the algorithm) and sampled output the "
              "same distribution."},
    "spec.a": {"zh": "逐个接受概率 a", "en": "Per-token acceptance a"},
    "spec.a.help": {
        "zh": "前面的草稿都被接受时，下一个草稿被接受的概率：接受数 ÷ 被验证数（拒绝之后的草稿没被"
              "验证，不算）。公式 (1 − a^(k+1)) / (1 − a) 用的是它。",
        "en": "The chance a drafted token is accepted given the ones before it were: accepted "
              "÷ examined (drafts after a rejection are never examined). The formula "
              "(1 − a^(k+1)) / (1 − a) uses this one."},
    "spec.predicted_per_pass": {"zh": "公式预测：每次目标前向的 token",
                                "en": "Formula: tokens per target pass"},
    "spec.predicted_per_pass.help": {
        "zh": "(1 − a^(n+1)) / (1 − a)，n 是每次实际起草的个数（最多 k = {k}），对每次验证取平均。",
        "en": "(1 − a^(n+1)) / (1 − a) with n the tokens actually drafted (at most k = {k}), "
              "averaged over the verifications."},
    "spec.formula_vs_measured": {
        "zh": "a = {a:.2f}，平均起草 {n:.1f} 个：公式预测每次目标前向出 {pred:.2f} 个 token，实测 "
              "{got:.2f} 个。接受率（接受 ÷ 起草）更低，因为它把拒绝之后被丢弃、没验证的草稿也算进了分母。",
        "en": "a = {a:.2f}, {n:.1f} drafted on average: the formula predicts {pred:.2f} tokens "
              "per target pass, measured {got:.2f}. The acceptance rate (accepted ÷ drafted) "
              "is lower: its denominator also counts the drafts thrown away unexamined after a "
              "rejection."},
    "spec.mean_accepted": {"zh": "平均接受长度", "en": "Mean accepted length"},
    "spec.mean_accepted.help": {"zh": "每次验证平均被接受的草稿 token 数。",
                                "en": "Drafted tokens accepted per verification, on average."},
    "spec.tokens_per_pass": {"zh": "每次目标前向的 token", "en": "Tokens per target pass"},
    "spec.tokens_per_pass.help": {"zh": "接受的草稿 + 目标自己的 1 个（纠正或额外 token）。",
                                  "en": "Accepted drafts + the target's own one (correction "
                                        "or bonus)."},
    "spec.speedup_now": {"zh": "实测加速", "en": "Measured speedup"},
    "spec.speedup_now.help": {"zh": "投机 {a:.1f} tok/s ÷ 不投机 {b:.1f} tok/s（引擎计算时间）。",
                              "en": "With speculation {a:.1f} tok/s ÷ without {b:.1f} tok/s "
                                    "(engine compute time)."},
    "spec.pick_request": {"zh": "请求", "en": "Request"},
    "spec.prompt_of": {"zh": "{rid}（{name}）的提示词：", "en": "Prompt of {rid} ({name}):"},
    "spec.no_drafts": {"zh": "这个请求还没有被验证过的草稿。",
                       "en": "No verified draft for this request yet."},
    "spec.no_drafts_yet": {"zh": "还没有草稿被验证；多走几步（请求要先读完提示词）。",
                           "en": "No draft verified yet; step on (requests read their prompt "
                                 "first)."},
    "spec.step": {"zh": "第 {n} 步", "en": "step {n}"},
    "spec.by_lookup": {"zh": "查提示词", "en": "prompt lookup"},
    "spec.verdict.accepted": {"zh": "接受", "en": "accepted"},
    "spec.verdict.rejected": {"zh": "拒绝", "en": "rejected"},
    "spec.verdict.discarded": {"zh": "拒绝之后、未经验证即丢弃", "en": "discarded after a rejection"},
    "spec.kind.correction": {"zh": "纠正", "en": "correction"},
    "spec.kind.bonus": {"zh": "额外", "en": "bonus"},
    "spec.target_token": {"zh": "目标模型自己的 token（纠正/额外）",
                          "en": "the target's own token (correction / bonus)"},
    "spec.tip.top": {"zh": "目标模型在这里最可能的：{alts}", "en": "target's most likely here: {alts}"},
    "spec.tip.pq": {"zh": "p_target {p} · p_draft {q}", "en": "p_target {p} · p_draft {q}"},
    "spec.tip.accept": {"zh": "接受概率 {a}（贪心：是目标模型的首选就收下；采样：min(1, p_target ÷ p_draft)）",
                        "en": "chance of acceptance {a} (greedy: kept if it is the target's top "
                              "token; sampled: min(1, p_target ÷ p_draft))"},
    "spec.tip.p": {"zh": "它在目标模型这一行的概率：{p}", "en": "its probability in the target's row: {p}"},
    "spec.alts_caption": {
        "zh": "草稿要对上的：目标模型在这个位置最可能的几个 token，取自验证器读的同一行"
              "（贪心：模型原始的 softmax；采样：经过温度、top-k、top-p 之后，即采样器抽样用的分布）。"
              "框出的是草稿 token。",
        "en": "What the draft had to match: the target's most likely tokens at this position, "
              "from the very row the verifier read (greedy: the model's plain softmax; sampling: "
              "after temperature, top-k and top-p, the distribution the sampler draws from). "
              "The drafted token is outlined."},
    "spec.next_alts": {
        "zh": "同一步目标模型自己的 token「{text}」（{kind}）和它那一行最可能的几个：",
        "en": "The same step's own token of the target, «{text}» ({kind}), and its row's most "
              "likely tokens:"},
    "spec.residual_note": {
        "zh": "采样时，纠正 token 是从 max(0, p_target − p_draft) 归一化后抽出来的，不是从这一行直接抽，"
              "所以它可能不在这一行的前几名里。",
        "en": "When sampling, a correction is drawn from normalize(max(0, p_target − p_draft)), "
              "not from this row itself, so it can be outside the row's top tokens."},
    "alts.mark.drafted": {"zh": "← 草稿", "en": "← drafted"},
    "alts.mark.emitted": {"zh": "← 产出", "en": "← emitted"},
    "alts.mark.chosen": {"zh": "← 采样器选的", "en": "← the sampler's choice"},
    "alts.rest": {"zh": "其余所有 token", "en": "every other token"},
    "alts.not_recorded": {"zh": "这个 token 没有记录候选（录制时还没有这项记录）。",
                          "en": "No alternatives were recorded for this token (the recording "
                                "predates them)."},
    "alts.header": {"zh": "token 检视器：采样器选了谁，其他候选是谁",
                    "en": "Token inspector: the sampler's choice and its alternatives"},
    "alts.pick_token": {"zh": "选它最近生成的一个 token", "en": "Pick one of its latest tokens"},
    "alts.caption": {
        "zh": "模型在这个位置给出的原始概率（温度 1，未经温度、top-k、top-p 处理，即 vLLM 的 raw "
              "logprobs）中最可能的 3 个 token；框出的是采样器选中的。温度为 0 时采样器总是选第一名；"
              "温度越高，后面的候选越常被抽中。",
        "en": "The model's own probabilities at this position (temperature 1, before temperature, "
              "top-k and top-p: vLLM's raw logprobs), its 3 most likely tokens; the outlined one "
              "is the sampler's choice. At temperature 0 the sampler always takes the first; the "
              "higher the temperature, the more often the others are drawn."},
    "alts.none": {
        "zh": "这次运行没有记录候选：只有不投机时才记录（要求 logprobs 的请求不会被起草）。"
              "投机解码页展示的是验证器自己记下的候选。",
        "en": "This run recorded no alternatives: they are recorded when speculation is off (a "
              "request that asks for log-probabilities is never drafted). The speculation page "
              "shows the verifier's own."},
    "alts.wait": {"zh": "按「单步」：生成的 token 会出现在这里。",
                  "en": "Press Step: tokens appear here as they are generated."},
    "spec.pick_token": {"zh": "选一个草稿 token 看它的接受概率",
                        "en": "Pick a drafted token to see its acceptance probability"},
    "spec.p_target.help": {"zh": "目标模型给这个 token 的概率。",
                           "en": "The target model's probability of this token."},
    "spec.p_draft.help": {"zh": "草稿给这个 token 的概率；n-gram 是确定的猜测，记为 1。",
                          "en": "The draft's probability of it; an n-gram guess is certain, 1."},
    "spec.ratio.help": {"zh": "以这个概率接受；拒绝时从 max(0, p_target − p_draft) 归一化后重采样。",
                        "en": "Accepted with this probability; on rejection the target samples "
                              "from normalize(max(0, p_target − p_draft))."},
    "spec.discarded_note": {"zh": "这个 token 排在被拒绝的 token 之后，根本没有被验证，直接丢弃。",
                            "en": "This token came after a rejected one: it was never examined, "
                                  "just thrown away."},
    "spec.greedy_note": {"zh": "温度为 0（贪心）：草稿等于目标的 argmax 才接受；这里的概率仅供参考。"
                               "把温度调到 1 可看到真正的拒绝采样。",
                         "en": "Temperature 0 (greedy): a draft is accepted iff it equals the "
                               "target's argmax; the probabilities are shown for reference. Set "
                               "the temperature to 1 to watch real rejection sampling."},
    "spec.sbs_header": {"zh": "贪心解码：开与关投机，文字相同，目标前向更少",
                        "en": "Greedy: the same text with fewer target passes"},
    "spec.sbs_caption": {
        "zh": "同样几个照抄型请求，温度 0，先关投机、再开投机，各跑到底，逐 token 比较，走精确的 fp32 路径。"
              "逐 token 相同靠的是数值计算不随批的形状变化：本引擎的 CPU 算子每一行单独、按固定顺序计算"
              "（批次不变）。换成求和顺序随行数变化的算子（GPU 上常见），验证一次算 1 + k 行、解码一次算 1 行，"
              "舍入不同，两个几乎并列的候选可能对调，长文本就会分岔——那是数值问题，不是算法。",
        "en": "A few grounded requests at temperature 0, run to the end with speculation off, "
              "then on, compared token by token, on the exact fp32 path. Identical tokens rely "
              "on arithmetic that does not change with the batch's shape: this engine's CPU "
              "kernels compute each row alone in a fixed order (batch-invariant). With kernels "
              "whose sums depend on the number of rows (common on GPUs), a verification pass "
              "(1 + k rows) rounds differently from a decode (1 row), two near-tied candidates "
              "can swap and long texts part ways: the kernels' numerics, not the algorithm."},
    "spec.sbs_run": {"zh": "运行对照（{method}，fp32，约一两分钟）",
                     "en": "Run the side-by-side ({method}, fp32, a minute or two)"},
    "spec.sbs_identical": {"zh": "逐 token 相同的请求", "en": "Requests identical token by token"},
    "spec.sbs_passes": {"zh": "目标前向次数（关 → 开）", "en": "Target passes (off → on)"},
    "spec.sbs_request": {"zh": "请求", "en": "request"},
    "spec.sbs_same": {"zh": "相同", "en": "same"},
    "spec.sbs_text": {"zh": "输出（两边相同时只列一份）", "en": "output (listed once when both agree)"},
    "spec.fwd_header": {"zh": "验证 k 个 token 要花几个单 token 步？GPU 小批量时约等于 1 个，这台 CPU 上看柱子",
                        "en": "What verifying k tokens costs: about one step on a GPU at small "
                              "batch; on this CPU, read the bars"},
    "spec.fwd_caption": {"zh": "目标模型一次前向处理 n 个新 token 的实测时间；柱上数字是相对 n = 1 的倍数。",
                         "en": "Measured time of one target forward pass over n new tokens; the "
                               "number on each bar is relative to n = 1."},
    "spec.fwd_measure": {"zh": "在本机实测前向代价", "en": "Measure the forward cost here"},
    "spec.fwd_title": {"zh": "一次前向的耗时", "en": "One forward pass"},
    "spec.fwd_tokens": {"zh": "新 token 数 n", "en": "new tokens n"},
    "spec.fwd_ms": {"zh": "毫秒", "en": "ms"},
    "spec.recorded": {"zh": "录制的数据，不是现场测量：assets/bench/{file}，由 `{cmd}` 于 {date} 在开发机上"
                            "测得（不是这台机器）。",
                      "en": "Recorded, not measured live: assets/bench/{file}, written by "
                            "`{cmd}` on {date} on the development machine (not this one)."},
    "spec.undated": {"zh": "（文件未记日期）", "en": "(no date in the file)"},
    "spec.measured_now": {"zh": "刚刚在本机实测。", "en": "Measured just now on this machine."},
    "spec.apprentice_header": {"zh": "学徒：准，还要便宜得多", "en": "The apprentice: accurate, and much cheaper"},
    "spec.apprentice_caption": {
        "zh": "草稿每走一步都要花时间。int4 孪生（目标模型自己的权重压成 int4）猜得准，但一步的耗时"
              "接近目标模型一步，没有 AMX 的机器上甚至更多；EAGLE 学徒只有一层，读目标模型自己的特征，只从最常见的 token 里挑，"
              "一步只要目标模型的一小部分。下表是基准测得的数（1 个请求在跑）。",
        "en": "Every draft step costs time. The int4 twin (the target's own weights in int4) "
              "guesses well, but one of its steps costs about a target step (more on a CPU "
              "without AMX); the EAGLE "
              "apprentice is one layer over the target's own features, drafting from the most "
              "frequent tokens only, and its step costs a small fraction of the target's. The "
              "table is what the bench measured (1 request running)."},
    "spec.apprentice_cuda": {
        "zh": "在 GPU（CUDA）上，int4 孪生并不便宜：它用的 int4/int8 压缩核只在 CPU 上有，所以在 GPU 上"
              "它以 bf16 副本运行，一步就是目标模型的一步（仍然无损）。GPU 上便宜的学徒是 EAGLE 学徒。",
        "en": "On a GPU (CUDA) the int4 twin is not cheaper: its packed int4/int8 kernels exist "
              "only for CPUs, so there it runs as a bf16 copy and one of its steps costs a "
              "target step (still lossless). On a GPU the cheap apprentice is the EAGLE head."},
    "spec.apprentice_trained": {
        "zh": "EAGLE 学徒：{params:.1f}M 参数 + {vocab} 个 token 的输出头；留出数据上逐 token 与目标一致 "
              "{agree:.0%}（看真实特征）；训练用时 {wall:.1f} 分钟（墙钟），{cpu:.1f} 分钟 CPU。",
        "en": "EAGLE apprentice: {params:.1f}M parameters + a {vocab}-token readout; agrees with "
              "the target on {agree:.0%} of held-out tokens (from the target's true features); "
              "trained in {wall:.1f} min wall, {cpu:.1f} min CPU."},
    "spec.apprentice.who": {"zh": "学徒", "en": "apprentice"},
    "spec.apprentice.int4": {"zh": "int4 孪生", "en": "int4 twin"},
    "spec.apprentice.eagle": {"zh": "EAGLE 学徒", "en": "EAGLE head"},
    "spec.apprentice.eagle_adaptive": {"zh": "EAGLE 学徒 · 自适应 k", "en": "EAGLE head · adaptive k"},
    "spec.apprentice.eagle_lookup": {"zh": "EAGLE 学徒 · 先查提示词 · 自适应 k",
                                     "en": "EAGLE head · lookup first · adaptive k"},
    "spec.apprentice.mb": {"zh": "每步读取 MB", "en": "MB read per step"},
    "spec.apprentice.cost": {"zh": "一步 ÷ 目标一步", "en": "step ÷ target step"},
    "spec.apprentice.acc_open": {"zh": "a · 开放", "en": "a · open"},
    "spec.apprentice.acc_grounded": {"zh": "a · 照抄", "en": "a · grounded"},
    "spec.apprentice.speed_open": {"zh": "加速 · 开放", "en": "speedup · open"},
    "spec.apprentice.speed_grounded": {"zh": "加速 · 照抄", "en": "speedup · grounded"},
    "spec.no_bench": {"zh": "没有找到投机解码基准文件（assets/bench/），所以没有「加速 vs 并发」图。",
                      "en": "No speculation benchmark file (assets/bench/), so no speedup vs "
                            "concurrency chart."},
    "spec.speedup_title": {"zh": "加速比 vs 并发请求数", "en": "Speedup vs concurrent requests"},
    "spec.speedup_pick": {"zh": "图中显示的投机方式", "en": "Methods in the chart"},
    "spec.bound_a": {"zh": "每个草稿被收下的概率 a", "en": "chance a drafted token is kept, a"},
    "spec.bound_c": {"zh": "草稿一步 ÷ 目标一步，c", "en": "draft step ÷ target step, c"},
    "spec.bound": {
        "zh": "代入上面的前向代价（1 个请求）：a = {a:.2f}、c = {c:.2f} 的草稿最多快 {s:.2f} 倍（k = {k}）；"
              "即使每个草稿都被收下，也最多 {s1:.2f} 倍（k = {k1}，只量到验证 {n} 个 token）。"
              "公式：(1 + a + … + a^k) ÷ (T(k+1)/T(1) + k·c)。",
        "en": "With the forward costs above (1 request): a draft with a = {a:.2f} and c = {c:.2f} "
              "gives at most {s:.2f}x (k = {k}); even a draft accepted every time gives at most "
              "{s1:.2f}x (k = {k1}; measured up to verifying {n} tokens). The formula: "
              "(1 + a + … + a^k) ÷ (T(k+1)/T(1) + k·c)."},
    "spec.bound_needed": {
        "zh": "同样的代价下，c = {c:.2f} 的草稿要达到 {g1:g} 倍需要 a ≥ {a1}，达到 {g2:g} 倍需要 "
              "a ≥ {a2}（目标：开放式提示 {g1:g} 倍，照抄式提示 {g2:g} 倍）。",
        "en": "On the same costs, a draft with c = {c:.2f} needs a ≥ {a1} for {g1:g}x and "
              "a ≥ {a2} for {g2:g}x (the goals: {g1:g}x on open prompts, {g2:g}x on "
              "grounded ones)."},
    "spec.bound_none": {"zh": "（任何 a 都不够）", "en": "(no a is enough)"},
    "spec.concurrency": {"zh": "并发请求数", "en": "concurrent requests"},
    "spec.speedup": {"zh": "加速比", "en": "speedup"},
    "spec.lossless_header": {"zh": "无损：投机不改变输出分布",
                             "en": "Lossless: speculation keeps the distribution"},
    "spec.lossless_caption": {
        "zh": "同一提示词、温度 1、不同种子各跑 N 次，开和关投机各一遍；比较第二个 token 的频率"
              "与目标模型（transformers 独立计算）的概率。",
        "en": "N seeded requests of one prompt at temperature 1, with and without "
              "speculation; the second token's frequencies against the target's probabilities "
              "(computed independently by transformers)."},
    "spec.lossless_n": {"zh": "请求数 N", "en": "Requests N"},
    "spec.lossless_run": {"zh": "运行（{method}）", "en": "Run it ({method})"},
    "spec.lossless_title": {"zh": "第二个 token 的分布", "en": "The second token's distribution"},
    "spec.probability": {"zh": "概率 / 频率", "en": "probability / frequency"},
    "spec.series.target": {"zh": "目标模型概率", "en": "target probability"},
    "spec.series.off": {"zh": "不投机的频率", "en": "frequency, no speculation"},
    "spec.series.on": {"zh": "投机（{method}）的频率", "en": "frequency, {method}"},
    "spec.lossless_result": {
        "zh": "条件：第一个 token 为「{first}」（不投机 {n_off}/{n} 次，投机 {n_on}/{n} 次）。"
              "与目标分布的总变差距离：不投机 {tv_off:.3f}，投机 {tv_on:.3f}；接受率 {acc}。"
              "两者都只是抽样误差，N 越大越接近 0。",
        "en": "Given the first token «{first}» ({n_off}/{n} runs without, {n_on}/{n} with "
              "speculation). Total variation distance to the target: without {tv_off:.3f}, "
              "with {tv_on:.3f}; acceptance {acc}. Both are sampling noise and shrink as N "
              "grows."},
    # ---- gauges (dashboard)
    "gauge.tokens_per_s": {"zh": "吞吐（token/秒）", "en": "Throughput (tokens/s)"},
    "gauge.tokens_per_s.help": {"zh": "最近若干步新生成的 token ÷ 这些步的计算时间。",
                                "en": "New tokens over the last steps ÷ their compute time."},
    "gauge.ttft": {"zh": "TTFT 中位数", "en": "TTFT p50"},
    "gauge.ttft.help": {"zh": "首 token 延迟：从到达到第一个 token，按引擎计算时间（不含点击间的停顿）。",
                        "en": "Time to first token, on the engine's clock (pauses between "
                              "clicks excluded)."},
    "gauge.tpot": {"zh": "TPOT 中位数", "en": "TPOT p50"},
    "gauge.tpot.help": {"zh": "首 token 之后每个 token 的平均时间：(末 token − 首 token) ÷ (token 数 − 1)，"
                              "按已完成的请求。",
                        "en": "Mean time per token after the first: (last − first token) ÷ "
                              "(tokens − 1), over finished requests."},
    "gauge.itl": {"zh": "ITL 中位数", "en": "ITL p50"},
    "gauge.itl.help": {"zh": "token 间延迟：同一请求相邻两次收到 token 的间隔，每次交付算一个样本。"
                             "和 TPOT 不是同一个量：投机一次交付好几个 token，TPOT 把这段时间摊到每个 token 上，比 ITL 低；"
                             "ITL 则约等于一轮投机（起草 + 验证）的时间。叫法各处不一：vLLM 的投机解码文档说的"
                             "「token 间延迟」，指的是这里的 TPOT。",
                       "en": "Inter-token latency: the gap between two deliveries of a "
                             "request's tokens, one sample per delivery. Not the same as TPOT: "
                             "speculation delivers several tokens at once, so TPOT (the time spread "
                             "over the tokens) is lower than ITL, which is about one speculative "
                             "round (draft + verify). Names vary: vLLM's speculative decoding docs "
                             "say \"inter-token latency\" for what this app calls TPOT."},
    "gauge.tokens_per_pass": {"zh": "每次目标前向的 token", "en": "Tokens per target pass"},
    "gauge.tokens_per_pass.help": {"zh": "每次验证产出的 token（接受的草稿 + 目标自己的 1 个）；"
                                         "不投机时为 —。",
                                   "en": "Tokens each verification emits (accepted drafts + "
                                         "the target's own one); — without speculation."},
    "gauge.seats_busy": {"zh": "忙碌座位", "en": "Seats busy"},
    "gauge.seats_busy.help": {"zh": "此刻在算活请求的座位 ÷ 座位总数。",
                              "en": "Seats computing a live request ÷ all seats."},
    "gauge.kv_used": {"zh": "KV 已用 / 已分配", "en": "KV used / allocated"},
    "gauge.kv_used.help": {"zh": "存着 token 的槽位 ÷ 全部槽位；斜杠后是被请求占用（分配或预留）的比例。",
                           "en": "Slots holding tokens ÷ all slots; after the slash, the share "
                                 "held (allocated or reserved) by requests."},
    "gauge.kv_allocated": {"zh": "已分配", "en": "allocated"},
    "gauge.acceptance": {"zh": "接受率", "en": "Acceptance rate"},
    "gauge.acceptance.help": {"zh": "被接受的草稿 token ÷ 提出的草稿 token；不投机时为 —。",
                              "en": "Drafted tokens accepted ÷ drafted; — without speculation."},
    # ---- the Classroom page's recommended model for a Chinese class (app/components/model_choice.py)
    "mc.zh.button": {"zh": "中文课堂：用 {name}", "en": "For a Chinese class: use {name}"},
    "mc.zh.facts": {
        "zh": "{name}：能用中文回答的小模型，{{figure:qwen25_05b_params}} 个参数（据模型卡）。第一次启动"
              "课堂服务器时下载 {{figure:qwen25_05b_download}}（经 HF_ENDPOINT 设的镜像，之后用本机缓存）。"
              "在这台电脑上它按 {dtype} 运行，每解码一步读一遍全部权重：{step}，即每个参数 {nbytes} 字节。"
              "这台电脑刚测得的内存读速度是 {bw}（实测），所以每步至少约 {ms}（计算：两者相除）。它每步读"
              "的字节是自带模型（每步 {{figure:gguf_step_mb}}）的 {ratio} 倍（计算）。",
        "en": "{name}: a small model that answers in Chinese, {{figure:qwen25_05b_params}} "
              "parameters (its model card). The class server downloads "
              "{{figure:qwen25_05b_download}} on its first start (through the mirror "
              "HF_ENDPOINT names, then from this computer's cache). Here it runs in {dtype}, "
              "and every decode step reads all its weights once: {step}, {nbytes} bytes a "
              "parameter. This computer's memory read speed, measured just now, is {bw}, so a "
              "step takes at least about {ms} (computed: the one divided by the other). It "
              "reads {ratio} times (computed) the bytes a step of the bundled model reads "
              "({{figure:gguf_step_mb}})."},
    # the bytes a step of the recommended model reads, by the dtype this machine's plan gives it
    "mc.zh.step.bfloat16": {"zh": "{{figure:qwen25_05b_step_bf16}}",
                            "en": "{{figure:qwen25_05b_step_bf16}}"},
    "mc.zh.step.float32": {"zh": "{{figure:qwen25_05b_step_fp32}}",
                           "en": "{{figure:qwen25_05b_step_fp32}}"},
    # ---- class plan, predictions, summary
    "plan.intro": {
        "zh": "45 分钟的一堂课，分 {n} 站。每站一个问题：按「布置这一站」会设好这一站需要的每个开关和"
              "规模（其余恢复默认）、清零引擎并打开对应页面；学生先在页面上锁定预测，再按「播放」看答案。",
        "en": "A 45-minute class in {n} stops. Each stop asks one question: \"Set up this stop\" "
              "sets every switch and size its demo needs (the rest back to defaults), restarts "
              "the engine and opens its page; the students lock in a prediction there, then "
              "Play shows the answer."},
    "plan.stop": {"zh": "第 {n} 站 · {minutes} 分钟 · {page}", "en": "Stop {n} · {minutes} min · {page}"},
    "plan.start": {"zh": "布置这一站", "en": "Set up this stop"},
    "plan.knobs": {"zh": "设定", "en": "Sets"},
    "plan.total": {"zh": "合计 {m} 分钟", "en": "{m} minutes in all"},
    "plan.result": {"zh": "本堂课的预测：{pred}；实测：{value}（{verdict}）",
                    "en": "This class predicted: {pred}; measured: {value} ({verdict})"},
    "plan.right": {"zh": "猜中", "en": "right"},
    "plan.wrong": {"zh": "没猜中", "en": "missed"},
    "plan.notes": {"zh": "教师备注", "en": "Teacher's notes"},
    "plan.scale": {
        "zh": "规模提醒：这里是 CPU 上的 1.35 亿参数小模型、几十个请求；本章说的是 GPU 上的 70 亿参数模型、"
              "成千上万的用户。比例和方向可比，绝对数字不可比。",
        "en": "Scale: a 135M-parameter model on a CPU and tens of requests here; the chapter "
              "speaks of a 7B model on a GPU and thousands of users. Ratios and directions "
              "carry over, absolute numbers do not."},
    "paging.fullest": {"zh": "全部跑完。下面是它最满的时刻：第 {step} 步，{n} 个请求同时占着 KV。",
                       "en": "All done. Below, its fullest moment: step {step}, {n} requests "
                             "holding KV at once."},
    "predict.title": {"zh": "先预测：", "en": "Predict first:"},
    "predict.progress": {"zh": "第 {step} / {total} 步（播放时每次前进 {stride} 步），约剩 {s} 秒",
                         "en": "Step {step} of {total} (Play advances {stride} a tick), about "
                               "{s} s left"},
    "predict.choose": {"zh": "你的预测", "en": "Your prediction"},
    "predict.lock": {"zh": "锁定预测", "en": "Lock in my prediction"},
    "predict.before": {"zh": "先锁定预测，再按「单步」或「播放」。",
                       "en": "Lock in a prediction first, then press Step or Play."},
    "predict.yours": {"zh": "你的预测", "en": "Your prediction"},
    "predict.waiting": {"zh": "已锁定。按「播放」跑完所有请求，答案就会出现在这里。",
                        "en": "Locked. Press Play to run every request to the end; the answer "
                              "appears here."},
    "predict.measured": {"zh": "实测：{value}，落在「{choice}」。", "en": "Measured: {value}, in \"{choice}\"."},
    "predict.right": {"zh": "预测对了。", "en": "Your prediction was right."},
    "predict.wrong": {"zh": "和预测不同——这正是值得讨论的地方。",
                      "en": "Not what you predicted: that is the thing to discuss."},
    "summary.intro": {"zh": "本章的要点，每条都连到课上亲眼看到它的那一站。",
                      "en": "The chapter's points, each linked to the stop where the class saw it."},
    "summary.shown_at": {"zh": "在第 {n} 站看到：{title}", "en": "Seen at stop {n}: {title}"},
    # ---- calculators
    "calc.bad": {"zh": "输入有误：{msg}", "en": "Bad input: {msg}"},
    "calc.kv": {"zh": "KV 显存：每个 token、每段对话", "en": "KV memory per token and per conversation"},
    "calc.kv.model": {"zh": "模型形状", "en": "Model shape"},
    "calc.kv.layers": {"zh": "层数", "en": "layers"},
    "calc.kv.heads": {"zh": "KV 头数", "en": "KV heads"},
    "calc.kv.dim": {"zh": "头维度", "en": "head dim"},
    "calc.kv.bytes": {"zh": "每个数的字节", "en": "bytes per number"},
    "calc.kv.tokens": {"zh": "一段对话的 token 数", "en": "tokens in a conversation"},
    "calc.kv.per_token": {"zh": "每个 token", "en": "per token"},
    "calc.kv.per_conv": {"zh": "{n} 个 token 的对话", "en": "a {n}-token conversation"},
    "calc.kv.formula": {"zh": "2（K 和 V）× {l} 层 × {h} 个 KV 头 × {d} 维 × {b} 字节",
                        "en": "2 (K and V) × {l} layers × {h} KV heads × {d} dims × {b} bytes"},
    "calc.bus": {"zh": "大巴算术：回答长度 → 有效座位·步", "en": "Bus arithmetic: answer lengths → useful seat-steps"},
    "calc.bus.lengths": {"zh": "各请求的回答长度（token，按到达顺序）",
                         "en": "Answer lengths in tokens, in arrival order"},
    "calc.bus.seats": {"zh": "座位数", "en": "Seats"},
    "calc.bus.useful": {"zh": "有效 / 静态批算过的座位·步", "en": "Useful / seat-steps a static batch computes"},
    "calc.bus.static_frac": {"zh": "静态批的有效比例", "en": "Static batching, useful share"},
    "calc.bus.steps": {"zh": "步数：静态 → 连续", "en": "Steps: static → continuous"},
    "calc.bus.help": {"zh": "静态：每批跑到最长的回答结束；连续：座位一空，下一个请求马上坐上（不计预填充）。",
                      "en": "Static: each batch runs until its longest answer ends; continuous: "
                            "a freed seat takes the next request at once (prefill not counted)."},
    "calc.spec": {"zh": "a 和 k → 每次目标前向的 token", "en": "a and k → tokens per target pass"},
    "calc.roof": {"zh": "受内存所限还是受算力所限（屋顶线）", "en": "Memory-bound or compute-bound (the roofline)"},
    "calc.roof.help": {
        "zh": "每个点是侧边栏引擎的一步：横轴是这一步算的 token 数，纵轴是「权重字节 ÷ 这一步的时间」。"
              "红线是这台机器实测的读带宽：点贴着红线，说明这一步的时间都花在读权重上（受内存所限）；"
              "token 多到点往下掉，说明计算开始成为瓶颈。",
        "en": "Each dot is one step of the sidebar's engine: across, the tokens it computed; up, "
              "its weight bytes ÷ its time. The red line is this machine's measured read "
              "bandwidth: a dot near it spent its time reading weights (memory-bound); when "
              "enough tokens make the dots fall, compute has become the limit."},
    "calc.roof.measure": {"zh": "实测这台机器的读带宽", "en": "Measure this machine's read bandwidth"},
    "calc.roof.no_steps": {"zh": "先在侧边栏按几次「单步」或「播放」，这里才有引擎的步。",
                           "en": "Press Step or Play in the sidebar first: the engine's steps show here."},
    "calc.roof.tokens": {"zh": "这一步算的 token", "en": "tokens in the step"},
    "calc.roof.rate": {"zh": "权重字节 ÷ 步时（GB/s）", "en": "weight bytes ÷ step time (GB/s)"},
    "calc.roof.result": {
        "zh": "读带宽 {bw:.1f} GB/s，权重 {w:.0f} MB：一步至少 {floor:.1f} 毫秒；最快的一步相当于 {best:.1f} GB/s。",
        "en": "Read bandwidth {bw:.1f} GB/s, weights {w:.0f} MB: a step takes at least "
              "{floor:.1f} ms; the fastest step here reads at {best:.1f} GB/s."},
    # ---- home
    "home.headline": {"zh": "同一张卡，几倍的用户", "en": "Same card, many times the users"},
    "home.intro": {
        "zh": "同样的权重、同样的硬件，换一种服务方式，吞吐就能差出几倍。下面先在这台机器上"
              "亲眼看一场比赛，再顺着地图去看三处漏洞各漏在哪里。",
        "en": "Same weights, same hardware: serve them differently and throughput changes "
              "several-fold. Watch a race on this very machine, then follow the map to the "
              "three leaks."},
    "home.race": {"zh": "现场比赛：朴素服务 vs 引擎", "en": "Live race: naive server vs engine"},
    "home.race.what": {
        "zh": "同一组 {n} 个请求（长尾负载，回答最多 {cap} 个 token），{seats} 个座位；朴素服务是"
              "transformers 的 generate() 静态批，引擎是连续批处理 + 分页 KV。",
        "en": "The same {n} requests (long-tail workload, answers up to {cap} tokens), {seats} "
              "seats; the naive server is transformers' generate() on static batches, the "
              "engine runs continuous batching over a paged KV cache."},
    "home.race.differs": {
        "zh": "和本章场景的差别：这里是 CPU 上的 1.35 亿参数模型、几十个请求，一分钟左右跑完；本章说的是 GPU 上"
              "的 70 亿参数模型、成千上万的用户。少数长回答拖住整批大巴，正是这场比赛要让你看到的；请求越多、"
              "回答越参差，倍数越大（实测 {{figure:race_ratio}}：{{source:engine-bench}}）。这是两个完整服务器的比赛，"
              "倍数有几个来源：那次测量里，引擎用朴素的策略（静态批、整块预留 KV）就已是朴素服务的 "
              "{{figure:race_engine_naive_policies}}（它自己的算子），连续批处理再乘 {{figure:race_continuous}}，"
              "分页在这个显存预算下是 {{figure:race_paged}}（显存紧时才见效）。",
        "en": "What differs from the chapter: a 135M model on a CPU and a few dozen requests, "
              "about a minute in all, against a 7B model on a GPU and thousands of users. A few "
              "long answers holding the whole bus is what this race shows; more requests and "
              "more varied answers widen the gap (measured: {{figure:race_ratio}}, by "
              "{{source:engine-bench}}). It races two whole servers, so the multiple has several "
              "causes: in that run the engine with the naive policies (static batches, "
              "contiguous KV) was already {{figure:race_engine_naive_policies}} the naive server "
              "(its own kernels), continuous batching added {{figure:race_continuous}}, and "
              "paging {{figure:race_paged}} at this memory budget (it pays when memory is "
              "short)."},
    "home.race.start": {"zh": "开始比赛", "en": "Start the race"},
    "home.race.running": {"zh": "比赛进行中……", "en": "Racing…"},
    "home.race.not_yet": {"zh": "还没有比过；按上面的按钮（CPU 上大约一分钟，机器忙时更久）。",
                          "en": "Not raced yet; press the button (about a minute on a CPU, more "
                                "when the machine is busy)."},
    "home.race.naive": {"zh": "朴素服务", "en": "Naive server"},
    "home.race.engine": {"zh": "引擎", "en": "Engine"},
    "home.race.ratio": {"zh": "倍数", "en": "Ratio"},
    "home.race.detail": {
        "zh": "朴素服务 {nt} 个 token 用 {ns:.1f} 秒；引擎 {et} 个 token 用 {es:.1f} 秒。设备：{device}。",
        "en": "Naive: {nt} tokens in {ns:.1f} s; engine: {et} tokens in {es:.1f} s. "
              "Device: {device}."},
    "home.race.small_gap": {
        "zh": "差距不大？这里是 CPU、小模型、几十个回答：每一步本身很便宜，引擎每步自己的开销"
              "（调度、块表、为本应用画图而生成的逐步报告）和它省下的空座位差不多一样重；"
              "回答越长越参差、请求越多、换成 GPU，省下的座位就越占上风。三个漏洞的页面逐一量给你看。",
        "en": "A small gap? This is a CPU, a small model and a few dozen answers: each step is "
              "cheap, so the engine's own per-step work (scheduling, block tables, the report "
              "this app draws every step) weighs about as much as the seats it saves. With "
              "longer, more varied answers, more requests or a GPU, the saved seats win. The "
              "three leak pages measure each one."},
    "home.map": {"zh": "地图：三处漏洞，三个补丁", "en": "The map: three leaks, three patches"},
    "home.fix": {"zh": "补丁", "en": "Patch"},
    "home.improves": {"zh": "主要改善", "en": "Mainly improves"},
    "home.leak.batching": {"zh": "漏洞 1：占座", "en": "Leak 1: seats"},
    "home.leak.batching.what": {"zh": "做完的请求还占着批里的座位。",
                                "en": "Finished requests keep their seat in the batch."},
    "home.leak.batching.fix": {"zh": "连续批处理", "en": "continuous batching"},
    "home.leak.batching.gain": {"zh": "吞吐、排队时间", "en": "throughput, queueing"},
    "home.leak.paging": {"zh": "漏洞 2：KV 显存", "en": "Leak 2: KV memory"},
    "home.leak.paging.what": {"zh": "KV 按最大长度整块预留，还留下碎片。",
                              "en": "KV reserved for the maximum length, then fragmented."},
    "home.leak.paging.fix": {"zh": "PagedAttention（分页）", "en": "PagedAttention"},
    "home.leak.paging.gain": {"zh": "吞吐（同时装下更多请求）", "en": "throughput (more requests fit)"},
    "home.leak.speculation": {"zh": "漏洞 3：一次一个", "en": "Leak 3: one at a time"},
    "home.leak.speculation.what": {"zh": "整套权重读一遍，只换来一个 token。",
                                   "en": "A full pass over the weights buys one token."},
    "home.leak.speculation.fix": {"zh": "投机解码", "en": "speculative decoding"},
    "home.leak.speculation.gain": {"zh": "单个用户的延迟", "en": "one user's latency"},
}

# The class plan's stops (app/classplan.py, app/predict.py, app/pages/plan.py): one block, kept
# apart so that other edits of the table above merge cleanly.
STRINGS.update({
    "workload.chat": {"zh": "问答：回答在 EOS 处结束", "en": "chat: answers end at EOS"},
    "plan.expect": {"zh": "章节预期的范围：{range}。{why}", "en": "The chapter's range: {range}. {why}"},
    "plan.in_range": {"zh": "在章节预期的范围内", "en": "inside the chapter's range"},
    "plan.out_of_range": {"zh": "不在章节预期的范围内（{range}），值得和学生讨论为什么",
                          "en": "outside the chapter's range ({range}): worth asking the class why"},
    "plan.slack": {"zh": "各站合计 {m} 分钟，留 {s} 分钟机动（提问、等引擎、讨论）。",
                   "en": "The stops take {m} minutes, leaving {s} minutes of slack (questions, "
                         "waiting on the engine, discussion)."},
    "predict.before_race": {"zh": "先锁定预测，再按「开始比赛」。",
                            "en": "Lock in a prediction first, then press \"Start the race\"."},
    "predict.waiting_race": {"zh": "已锁定。按「开始比赛」，比赛跑完后答案就会出现在这里。",
                             "en": "Locked in. Press \"Start the race\"; when the race is over the "
                                   "answer appears here."},
    "paging.held_unwritten": {"zh": "占着、没写（槽位）", "en": "Held, not written (slots)"},
    "paging.held_unwritten.help": {
        "zh": "请求占着、却没存 token 的槽位。整块预留时，它包括为以后的 token 留着的位（预留未用），"
              "以及回答在 EOS 处提前结束、永远不会写的位（内部碎片）；分页时只剩每个请求最后一块没写满的部分"
              "（内部碎片）。外部碎片另算：空闲合计够、最长的一段连续空闲却不够。",
        "en": "Slots requests hold that hold no token. Contiguous: room kept for tokens still to "
              "come (reserved), plus the room an answer that ended early at EOS will never write "
              "(internal fragmentation). Paged: only each request's last, partly filled block "
              "(internal fragmentation). External fragmentation is shown apart: enough free in "
              "total, but no free run long enough."},
    "paging.useful_held": {"zh": "占着的里存着 token", "en": "Held slots holding tokens"},
    "paging.useful_held.help": {
        "zh": "存着 token 的槽位 ÷ 请求占着的槽位。PagedAttention 论文的 {{figure:paper_useful_kv}} "
              "除的是整个 KV 显存（碎片也算在内），分母不同。",
        "en": "Slots holding tokens ÷ slots requests hold. The PagedAttention paper's "
              "{{figure:paper_useful_kv}} divides by all KV memory (fragments included), a "
              "different denominator."},
    "apprentice.missing": {
        "zh": "EAGLE 学徒（在目标模型特征上训练的一层草稿头）还没训练。按下面的按钮在这台机器上训练"
              "（2 核 CPU 约 15 分钟，只需一次），训练完它就出现在上面的开关里。",
        "en": "The EAGLE apprentice (a one-layer draft head on the target's features) is not "
              "trained yet. The button below trains it on this machine (about 15 minutes on 2 CPU "
              "cores, once); when it is done, the switch above offers it."},
    "apprentice.train": {"zh": "训练学徒草稿头", "en": "Train the apprentice"},
    "apprentice.training": {"zh": "正在训练学徒：{pct}%（可以继续上课）",
                            "en": "Training the apprentice: {pct}% (the class can go on)"},
    "apprentice.failed": {"zh": "训练没有完成：{tail}", "en": "The training did not finish: {tail}"},
    "class.status.starting": {"zh": "正在重启课堂引擎……", "en": "Restarting the class engine…"},
    "class.status.draining": {"zh": "先让进行中的请求答完，然后重启课堂引擎……",
                              "en": "Finishing the requests in flight, then restarting the class "
                                    "engine…"},
    "class.status.restarting": {"zh": "正在用新开关启动课堂引擎……",
                                "en": "Starting the class engine with the new switches…"},
})


def _default_lang() -> str:
    try:
        locale = st.context.locale or ""
    except Exception:  # no browser context (bare mode, some tests)
        locale = ""
    return "en" if str(locale).lower().startswith("en") else "zh"


def get_lang() -> str:
    """The current session's language: `st.session_state["lang"]`, else from the browser locale."""
    for lang in (st.session_state.get("lang"), st.session_state.get(KEPT_LANG)):
        if lang in LANGS:
            return lang
    return _default_lang()


def t(key: str, **fmt: object) -> str:
    """The UI string `key` in the current language, formatted with `fmt`; the key if unknown."""
    entry = STRINGS.get(key)
    if entry is None:
        return key
    lang = get_lang()
    text = entry.get(lang) or entry["zh"]
    if "{{" in text:  # a figure from lessons/figures.json, filled before `fmt` reads braces
        text = fill_figures(text, lang, key, tag="words")  # each figure says its kind
    return text.format(**fmt) if fmt else text


def switch_label(name: str, value: str | None = None) -> str:
    """The display name of a switch, or of one of its values."""
    return t(f"switch.{name}" if value is None else f"switch.{name}.{value}")


def language_selector() -> str:
    """Draw the sidebar radio 中文 / English bound to `st.session_state["lang"]`; return the lang.

    Safe to call from both the app shell and a page run on its own: when the shell has already
    drawn it in this run, the second call draws nothing.
    """
    # Streamlit forgets a widget's value when a run ends early (st.switch_page, st.rerun)
    # after drawing it, so the choice is also kept under a key no widget owns.
    if st.session_state.get("lang") not in LANGS:
        st.session_state["lang"] = st.session_state.get(KEPT_LANG) or _default_lang()
    st.session_state[KEPT_LANG] = st.session_state["lang"]
    try:
        st.sidebar.radio(
            STRINGS["lang.label"]["zh"],  # fixed label: one widget id in both languages
            LANGS,
            format_func=LANG_LABELS.__getitem__,
            key="lang",
            horizontal=True,
        )
    except (StreamlitDuplicateElementKey, StreamlitDuplicateElementId):
        pass
    return get_lang()


# The Classroom page and its components (app/pages/classroom.py, app/components/classroom.py):
# one block, kept apart so that other edits of the table above merge cleanly.
STRINGS.update({
    "cls.title": {"zh": "课堂：全班共用一台引擎", "en": "Classroom: the whole class on one engine"},
    "cls.intro": {"zh": "每位学生用手机提问；投影上能看到他们的请求在门口排队、入座、页表增长、离开。"
                        "然后加入上千个模拟用户，再拨动开关。",
                  "en": "Each student asks from a phone; the projector shows their requests queue "
                        "at the door, take a seat, grow their page tables and leave. Then add a "
                        "thousand simulated users and flip the switches."},
    "cls.start.title": {"zh": "开始上课", "en": "Start the class"},
    "cls.network": {"zh": "允许同一网络的手机加入", "en": "Let phones on this network join"},
    "cls.network.help": {
        "zh": "关闭：服务器只监听 127.0.0.1，只有这台电脑能打开学生页面。打开：监听这台电脑的"
              "网络地址，同一 Wi-Fi 的手机都能加入，这时需要加入码。",
        "en": "Off: the server listens on 127.0.0.1, so only this computer can open the "
              "students' page. On: it listens on this computer's network address, so phones "
              "on the same Wi-Fi can; the join code is then required."},
    "cls.listen": {"zh": "将监听 {host}", "en": "It will listen on {host}"},
    "cls.listen.nolan": {"zh": "（没有找到网络地址：只有这台电脑）",
                         "en": " (no network address found: this computer only)"},
    "cls.kv.knob": {"zh": "KV 块数（全班共用的池）", "en": "KV blocks (the class's pool)"},
    "cls.kv.knob.help": {
        "zh": "全班共用的 KV 池有多少块（每块 16 个 token）。默认大小让三十人的班级能明显填满它；"
              "调小就能看到请求因 KV 已满而在门口等待。",
        "en": "How many blocks (16 tokens each) the class's KV pool holds. The default is "
              "sized so a class of thirty visibly fills it; make it smaller to see requests "
              "wait at the door because the KV cache is full."},
    "cls.start": {"zh": "启动课堂服务器", "en": "Start the class server"},
    "cls.starting": {"zh": "正在启动 python -m classroom.serve ……",
                     "en": "starting python -m classroom.serve ..."},
    "cls.starting.download": {"zh": "下载模型（中断后下次启动会接着下载）：{what}",
                              "en": "downloading the model (a cancelled download resumes on "
                                    "the next start): {what}"},
    "cls.start.cancel": {"zh": "取消启动", "en": "Cancel the start"},
    "cls.adopt": {"zh": "连接到 {url}", "en": "Connect to {url}"},
    "cls.switches": {"zh": "课堂引擎的开关", "en": "The class engine's switches"},
    "cls.engine_now": {"zh": "现在的引擎：{config} · KV 池 {kv} 块",
                       "en": "The engine now: {config} · KV pool of {kv} blocks"},
    "cls.apply": {"zh": "切换方式", "en": "Apply"},
    "cls.apply.drain": {"zh": "等进行中的请求完成后", "en": "after the requests in flight finish"},
    "cls.apply.abort": {"zh": "立即（中断它们，手机会自动重问）",
                        "en": "now, cutting them (phones ask again by themselves)"},
    "cls.apply.button": {"zh": "用这些开关换一台引擎（地址和加入码不变）",
                         "en": "Swap the engine for these switches (same address and join code)"},
    "cls.apply.refused": {"zh": "服务器拒绝了切换：{why}", "en": "The server refused the switch: {why}"},
    "cls.stop": {"zh": "停止课堂服务器", "en": "Stop the class server"},
    "cls.swap.draining": {"zh": "正在等进行中的 {n} 个请求完成：最多再等 {s} 秒，之后换上新引擎",
                          "en": "Finishing the {n} requests in flight: at most {s} s more, then "
                                "the new engine"},
    "cls.swap.building": {"zh": "正在构建新引擎……", "en": "Building the new engine..."},
    "cls.swap.same_address": {"zh": "地址、加入码和二维码保持不变：学生不需要重新扫码。",
                              "en": "The address, join code and QR code stay the same: no "
                                    "student needs to scan again."},
    "cls.join.at": {"zh": "加入地址", "en": "Join at"},
    "cls.join.code": {"zh": "加入码", "en": "Join code"},
    "cls.join.none": {"zh": "（无：仅限这台电脑）", "en": "(none: this computer only)"},
    "cls.join.scan": {"zh": "扫码加入", "en": "scan to join"},
    "cls.join.local": {"zh": "正在监听 127.0.0.1：只有这台电脑能加入。停止后勾选“允许同一网络的手机加入”"
                             "再启动，全班就能加入。",
                       "en": "Listening on 127.0.0.1: only this computer can join. Stop, tick "
                             "\"Let phones on this network join\" and start again for the class."},
    "cls.join.lan": {"zh": "正在监听 {host}（这台电脑在网络上的地址），因为你允许手机加入；"
                           "这个网络上任何有加入码的人都能提问。",
                     "en": "Listening on {host}, this computer's address on its network, "
                           "because you asked phones to join; anyone on this network with the "
                           "join code can ask questions."},
    "cls.sim.title": {"zh": "模拟用户", "en": "Simulated users"},
    "cls.sim.stop": {"zh": "停止模拟用户", "en": "Stop the simulated users"},
    "cls.sim.users": {"zh": "用户数", "en": "Users"},
    "cls.sim.arrivals": {"zh": "到达方式", "en": "Arrivals"},
    "cls.sim.rate": {"zh": "速率（用户/秒）", "en": "Rate (users/s)"},
    "cls.sim.add": {"zh": "加入 {n} 个模拟用户", "en": "Add {n} simulated users"},
    "cls.sim.progress": {"zh": "模拟用户：已服务 {done} / {total}",
                         "en": "simulated users: {done} of {total} served"},
    "cls.waiting_first": {"zh": "等待第一步：请从学生页面提一个问题。",
                          "en": "Waiting for the first step: ask a question from the "
                                "students' page."},
    "cls.live.line": {"zh": "**第 {step} 步** · 就座学生：{person} · 刚答完：{answered} · "
                            "就座模拟用户：{sim} · 门口等待：{waiting}",
                      "en": "**Step {step}** · students seated: {person} · just answered: "
                            "{answered} · simulated seated: {sim} · waiting: {waiting}"},
    "cls.table": {"zh": "每种配置的实测结果", "en": "Each configuration, measured"},
    "cls.redrawn": {"zh": "重绘用时 {ms} 毫秒 · 已收到 {n} 步",
                    "en": "redrawn in {ms} ms · {n} steps received"},
    "cls.questions": {"zh": "在投影上显示问题", "en": "Show questions on screen"},
    "cls.questions.help": {"zh": "关闭：只显示昵称。投影是公开的。",
                           "en": "Off: nicknames only. The projector is public."},
    "cls.large": {"zh": "大字模式", "en": "Large type"},
    "cls.large.help": {"zh": "为大教室放大座位、门口、KV 池和仪表的文字。",
                       "en": "Bigger seats, door, KV pool and gauges for a large room."},
    "cls.door": {"zh": "门口等待：{n}", "en": "At the door: {n}"},
    "cls.door.more": {"zh": "另有 {n} 名学生", "en": "+{n} students"},
    "cls.door.sims": {"zh": "{n} 个模拟用户", "en": "{n} simulated"},
    "cls.student.row": {"zh": "座位 {seat}，{blocks} 个块，{tokens} 个 token · {state}",
                        "en": "seat {seat}, {blocks} blocks, {tokens} tokens · {state}"},
    "cls.state.waiting": {"zh": "等待中", "en": "waiting"},
    "cls.state.seated": {"zh": "已就座", "en": "seated"},
    "cls.state.answered": {"zh": "已答完", "en": "answered"},
    "cls.timeline.pick": {"zh": "点一个昵称，看这个请求一步一步的经过",
                          "en": "Click a nickname for that request, step by step"},
    "cls.timeline.pick.help": {
        "zh": "排队（以及每段等待的原因）、预填充、解码、被抢占：步数和毫秒，和学生手机上画的一样。",
        "en": "Queued (with the reason for each stretch of waiting), prefill, decode, "
              "preempted: steps and milliseconds, as the student's phone draws them."},
    "cls.timeline.gone": {"zh": "服务器已不再保留这个请求。",
                          "en": "The class server no longer keeps this request."},
    "cls.trace": {"zh": "下载课堂服务器最近的步骤（trace，Perfetto、chrome://tracing 可打开）",
                  "en": "Download the class server's recent steps as a trace (Perfetto, "
                        "chrome://tracing)"},
    "cls.trace.help": {
        "zh": "每个座位一条轨道、每个请求一条轨道（等待原因、预填充、解码），以及从某人答完到下一位入座的箭头。",
        "en": "A track per seat and per request (wait reasons, prefill, decode), with arrows "
              "from the finish that freed a seat to whoever boarded it."},
    "tl.title": {"zh": "{name} 的请求，一步一步", "en": "{name}'s request, step by step"},
    "tl.none": {"zh": "它还没有经过一步。", "en": "It has not been through a step yet."},
    "tl.queued": {"zh": "排队", "en": "queued"},
    "tl.prefill": {"zh": "预填充", "en": "prefill"},
    "tl.decode": {"zh": "解码", "en": "decode"},
    "tl.preempted": {"zh": "被抢占", "en": "preempted"},
    "tl.steps": {"zh": "第 {a}–{b} 步（{n} 步）· {t0}–{t1} 毫秒",
                 "en": "steps {a}–{b} ({n}) · {t0}–{t1} ms"},
    "tl.step": {"zh": "第 {a} 步（1 步）· {t0}–{t1} 毫秒", "en": "step {a} (1) · {t0}–{t1} ms"},
    "tl.redo": {"zh": "重算规则：要重新计算 {n} 个 token", "en": "recompute: {n} tokens to redo"},
    "tl.ms": {"zh": "{x} 毫秒", "en": "{x} ms"},
    "tl.s": {"zh": "{x} 秒", "en": "{x} s"},
    "seats.state.answered": {"zh": "已答完", "en": "answered"},
    "cls.kv.block": {"zh": "块 #{n} · {who} · {tokens}/{size} 个 token",
                     "en": "block #{n} · {who} · {tokens}/{size} tokens"},
    "cls.kv.size": {"zh": "KV 池：已用 {used} / {total} 块（{pct}%），每块 {bs} 个 token",
                    "en": "KV pool: {used} of {total} blocks in use ({pct}%), {bs} tokens each"},
})

# the "beyond" page's four pictures (app/pages/beyond.py)
STRINGS.update({
    "beyond.figs_header": {"zh": "CPU 演示不了的，用公式画出来", "en": "What a CPU cannot show, drawn from the formulas"},
    "beyond.figs_intro": {
        "zh": "下面四张图各自标明来源：「计算所得」是按公式算出的（不是测量）；「实测」写明命令、机器和日期；"
              "「录制」来自随应用附带的一次真实引擎运行；「本机实时」是此刻在这台机器上跑引擎自己的代码。",
        "en": "Each of the four pictures below says where it comes from: \"computed\" is worked out "
              "from the formulas (not measured); \"measured\" names its command, machine and date; "
              "\"recorded\" comes from a real engine run bundled with the app; \"live on this "
              "machine\" runs the engine's own code right now."},
    # 1. the acceptance rule
    "beyond.acc.header": {"zh": "接受规则：两组柱子的重叠就是接受概率",
                          "en": "The acceptance rule: the overlap of the two bar charts is the acceptance probability"},
    "beyond.acc.source": {
        "zh": "目标分布 p（录制的模型输出）：{model} 在「{prompt}」之后下一个 token 概率最高的 {n} 个，"
              "只在这 {n} 个里重新归一化（相当于 top-k = {n} 采样真正采样的分布）；"
              "命令 `{command}`，机器：{machine}，{date}。草稿分布 q 由 p 变形而来（计算所得），用下面的滑块拖动。",
        "en": "Target p (recorded model output): {model}'s {n} most likely next tokens after \"{prompt}\", "
              "renormalised over those {n} (the distribution top-k = {n} sampling really samples); "
              "`{command}` on {machine}, {date}. The draft q is made from p (computed): drag it "
              "with the sliders."},
    "beyond.acc.constructed": {
        "zh": "没有找到录制的模型分布（assets/beyond/next_token.json），下面是一个人为构造的例子。",
        "en": "No recorded model distribution (assets/beyond/next_token.json) was found: below is "
              "a constructed example."},
    "beyond.acc.temperature": {"zh": "草稿温度（q ∝ p^(1/温度)；1 = 与 p 相同）",
                               "en": "Draft temperature (q ∝ p^(1/temperature); 1 = same as p)"},
    "beyond.acc.mix": {"zh": "把草稿拉回 p 的比例（1 = q 就是 p）",
                       "en": "Share of the draft moved back to p (1 = q is p)"},
    "beyond.acc.target": {"zh": "目标 p", "en": "target p"},
    "beyond.acc.draft": {"zh": "草稿 q", "en": "draft q"},
    "beyond.acc.prob": {"zh": "概率", "en": "probability"},
    "beyond.acc.left_title": {"zh": "目标与草稿", "en": "Target and draft"},
    "beyond.acc.right_title": {"zh": "p = min(p, q) + (p − q)⁺；右侧为归一化残差",
                               "en": "p = min(p, q) + (p − q)⁺; right: the normalised residual"},
    "beyond.acc.kept": {"zh": "min(p, q)：被接受的部分", "en": "min(p, q): accepted mass"},
    "beyond.acc.excess": {"zh": "(p − q)⁺：拒绝后补回的部分", "en": "(p − q)⁺: mass a rejection restores"},
    "beyond.acc.residual": {"zh": "残差 norm((p − q)⁺)", "en": "residual norm((p − q)⁺)"},
    "beyond.acc.computed": {"zh": "接受概率 Σmin(p, q)（计算所得）",
                            "en": "Acceptance probability Σmin(p, q) (computed)"},
    "beyond.acc.computed_help": {"zh": "按公式 Σ min(p, q) 算出，不是测量。",
                                 "en": "Worked out from Σ min(p, q), not measured."},
    "beyond.acc.measured": {"zh": "引擎拒绝采样器的接受比例（本机实测）",
                            "en": "Engine's rejection sampler, measured live"},
    "beyond.acc.measured_help": {
        "zh": "engine/spec/rejection.py 的采样器此刻在本机跑 {n} 次：每次从 q 抽一个草稿 token 再验证。",
        "en": "The sampler in engine/spec/rejection.py, run {n} times on this machine just now: "
              "each time a draft token is drawn from q and verified."},
    "beyond.acc.caption": {
        "zh": "从 q 抽一个草稿 token x，以 min(1, p(x)/q(x)) 的概率接受；所以被接受的总概率是 "
              "Σ q(x)·min(1, p(x)/q(x)) = Σ min(p, q)，也就是两组柱子重叠的面积。被拒绝时改从残差 "
              "norm((p − q)⁺) 抽一个 token，正好补上 p 比 q 多出来的部分，于是输出的分布和目标模型独自采样完全相同"
              "（Leviathan 等，ICML 2023；Chen 等，2023）。右边的数是 engine/spec/rejection.py 的采样器跑出来的，"
              "和左边的公式之差只是抽样误差。",
        "en": "A draft token x is drawn from q and kept with probability min(1, p(x)/q(x)); so the "
              "chance it is kept is Σ q(x)·min(1, p(x)/q(x)) = Σ min(p, q), the area where the two "
              "bar charts overlap. On a rejection a token is drawn from the residual "
              "norm((p − q)⁺), which puts back exactly the mass where p exceeds q, so the output is "
              "distributed as if the target had sampled alone (Leviathan et al., ICML 2023; Chen "
              "et al., 2023). The right-hand number comes from the sampler in "
              "engine/spec/rejection.py; it differs from the formula only by sampling noise."},
    # 2. the roofline
    "beyond.roof.header": {"zh": "GPU 规模的屋顶线：70 亿参数模型在 H100 / H200 上的一步解码（计算所得）",
                           "en": "A GPU-scale roofline: one decode step of a 7B model on an H100 / H200 (computed)"},
    "beyond.roof.source": {
        "zh": "计算所得，不是测量。模型：Llama-2-7B 的形状，{{figure:llama2_7b_params}} 参数（{{source:llama2}}），"
              "bf16 权重和 KV，每个 token 的 KV 为 {{figure:llama2_kv_per_token}}。"
              "H100 SXM：带宽 {{figure:h100_bandwidth}}、稠密 BF16 {{figure:h100_bf16_tflops}}、显存 {{figure:h100_memory}}"
              "（{{source:h100-datasheet}}）；H200 SXM：{{figure:h200_bandwidth}}、{{figure:h200_bf16_tflops}}、"
              "{{figure:h200_memory}}（{{source:h200-datasheet}}）。每步：字节 = 权重 + 批内每个请求读一遍它的 KV；"
              "FLOPs ≈ 2 × 参数量 × 新 token 数 + 注意力（每层 4 × d_model × 上下文 × 新 token 数）；"
              "权重矩阵乘和注意力是两种内核，各自取 max(字节 ÷ 带宽, FLOPs ÷ 峰值算力)，再相加（真实引擎依次运行它们）。真实内核达不到峰值：这里的步时是下限（实际只会更慢），加速比是理想值。",
        "en": "Computed, not measured. Model: Llama-2-7B's shape, {{figure:llama2_7b_params}} "
              "parameters ({{source:llama2}}), bf16 weights and KV, {{figure:llama2_kv_per_token}} "
              "of KV per token. H100 SXM: {{figure:h100_bandwidth}}, dense BF16 "
              "{{figure:h100_bf16_tflops}}, {{figure:h100_memory}} ({{source:h100-datasheet}}); "
              "H200 SXM: {{figure:h200_bandwidth}}, {{figure:h200_bf16_tflops}}, "
              "{{figure:h200_memory}} ({{source:h200-datasheet}}). Per step: bytes = weights + each "
              "request's KV read once; FLOPs ≈ 2 × parameters × new tokens + attention (per layer "
              "4 × d_model × context × new tokens); the weight matmuls and attention are two kernels, "
              "each timed as max(bytes ÷ bandwidth, FLOPs ÷ peak), and the two times added (real "
              "engines run them one after the other). "
              "Real kernels reach neither peak: the step times are lower bounds (real ones are "
              "slower) and the speedups are ideal."},
    "beyond.roof.gpu": {"zh": "GPU", "en": "GPU"},
    "beyond.roof.context": {"zh": "每个请求已有的上下文（token）", "en": "Context already cached per request (tokens)"},
    "beyond.roof.k": {"zh": "每轮起草的 token 数 k", "en": "Tokens drafted per round, k"},
    "beyond.roof.alpha": {"zh": "每个草稿 token 的接受率 α", "en": "Acceptance rate per drafted token, α"},
    "beyond.roof.draft_cost": {"zh": "起草一个 token 的代价（占一步解码的比例）",
                               "en": "Cost of drafting one token (share of a decode step)"},
    "beyond.roof.no_fit": {"zh": "这个上下文下，连一个请求的权重加 KV 都放不进显存。",
                           "en": "At this context not even one request's weights and KV fit in memory."},
    "beyond.roof.decode": {"zh": "解码（每请求 1 个 token）", "en": "decode (1 token per request)"},
    "beyond.roof.verify": {"zh": "验证（每请求 k + 1 个 token）", "en": "verify (k + 1 tokens per request)"},
    "beyond.roof.memory": {"zh": "内存带宽受限", "en": "memory-bound"},
    "beyond.roof.compute": {"zh": "算力受限", "en": "compute-bound"},
    "beyond.roof.batch": {"zh": "批大小（请求数）", "en": "batch (requests)"},
    "beyond.roof.ms": {"zh": "每步时间（毫秒，计算所得）", "en": "step time (ms, computed)"},
    "beyond.roof.speedup": {"zh": "投机加速比（计算所得）", "en": "speculation speedup (computed)"},
    "beyond.roof.left_title": {"zh": "一步的时间；虚线：解码的权重矩阵乘转为算力受限的批大小",
                               "en": "Time of one step; dashed: the batch where decode's weight matmuls turn compute-bound"},
    "beyond.roof.right_title": {"zh": "投机的加速比随批大小：权重矩阵乘转为算力受限后下降",
                                "en": "Speculation's gain by batch: it falls once the weight matmuls are compute-bound"},
    "beyond.roof.cross": {"zh": "解码的权重矩阵乘转为算力受限的批大小",
                          "en": "Batch where decode's weight matmuls turn compute-bound"},
    "beyond.roof.cross_verify": {"zh": "验证（每请求 {n} 个 token）转为算力受限的批大小",
                                 "en": "Batch where verifying ({n} tokens per request) does"},
    "beyond.roof.never": {"zh": "显存放满前不会", "en": "not before memory is full"},
    "beyond.roof.fit": {"zh": "显存能放下的最大批", "en": "Largest batch that fits in memory"},
    "beyond.roof.gain1": {"zh": "批大小 1 时的加速比", "en": "Speedup at batch 1"},
    "beyond.roof.caption": {
        "zh": "每轮验证期望得到 (1 − α^(k+1)) ÷ (1 − α) = {e} 个 token（Leviathan 等，2023）。"
              "验证一步要算 k + 1 个 token：在内存带宽受限区，它和一步普通解码几乎一样贵（权重只读一遍），"
              "所以加速比接近 {e}；批一大、权重矩阵乘转为算力受限，它的代价按 k + 1 倍增长，加速比就掉下来，短上下文时甚至低于 1。"
              "转折点就是峰值算力 ÷ 带宽 × 每个权重 2 字节 ÷ 每个权重 2 FLOPs：H100 约 "
              "{{figure:h100_ridge_batch}}、H200 约 {{figure:h200_ridge_batch}} 个请求（验证时再除以 k + 1）。注意力是另一种内核：每个请求都要读自己的 KV，"
              "而多头注意力每读 1 字节 KV 只做约 1 次 FLOP，它在放得下的任何批大小上都受限于带宽；上下文越长，这部分占一步的比重越大，投机就保住越多的加速（MagicDec，2024）。"
              "横轴只画到显存放得下的批。",
        "en": "Each verify yields (1 − α^(k+1)) ÷ (1 − α) = {e} tokens on average (Leviathan et "
              "al., 2023). A verify step computes k + 1 tokens per request: while the step is "
              "memory-bound it costs about one decode step (the weights are read once), so the "
              "speedup is near {e}; as the batch grows the weight matmuls turn compute-bound, their "
              "cost grows k + 1-fold and the gain falls, below 1 at short contexts. The crossover "
              "is peak ÷ bandwidth × 2 bytes per weight ÷ 2 FLOPs per weight: about "
              "{{figure:h100_ridge_batch}} requests on an H100, {{figure:h200_ridge_batch}} on an "
              "H200 (divided by k + 1 for a verify). Attention is another kernel: each request "
              "reads its own KV, and multi-head attention does about one FLOP per byte of KV, so "
              "it stays bandwidth-bound at any batch that fits; the longer the context, the more "
              "of a step it is, and the more of its gain speculation keeps (MagicDec, 2024). The "
              "x axis stops at the largest batch that fits."},
    # 3. one request's timeline
    "beyond.tl.header": {"zh": "一个请求的时间线：TTFT、TPOT、ITL 和投机的成串到达",
                         "en": "One request's timeline: TTFT, TPOT, ITL and speculation's bursts"},
    "beyond.tl.source": {
        "zh": "录制：随应用附带的 {file}，同一批请求在这台引擎上真实跑了两遍（{machine} 核，{date}），"
              "{seats} 个座位、{n} 个请求同时到达，连续批处理 + 分页；一遍不投机，一遍用 {spec}（k = {k}）。"
              "下面跟踪请求 {rid}：",
        "en": "Recorded: {file}, bundled with the app, the same requests run twice through this "
              "engine ({machine} cores, {date}), {seats} seats, {n} requests arriving together, "
              "continuous batching + paged; once without speculation, once with {spec} (k = {k}). "
              "Followed here, request {rid}:"},
    "beyond.tl.missing": {"zh": "没有找到附带的录制（要有同一批请求不投机和投机各一遍），这张图画不出来。",
                          "en": "The bundled recording (the same requests with and without "
                                "speculation) was not found, so this picture cannot be drawn."},
    "beyond.tl.off": {"zh": "不投机", "en": "no speculation"},
    "beyond.tl.on": {"zh": "{spec} 投机（k = {k}）", "en": "{spec} speculation (k = {k})"},
    "beyond.tl.ttft": {"zh": "首 token 延迟（TTFT）", "en": "TTFT"},
    "beyond.tl.tpot": {"zh": "TPOT", "en": "TPOT"},
    "beyond.tl.itl_max": {"zh": "最长 ITL", "en": "Longest ITL"},
    "beyond.tl.seconds": {"zh": "秒（引擎计算时间，从运行开始算）", "en": "seconds (engine time since the run began)"},
    "beyond.tl.run": {"zh": "运行", "en": "run"},
    "beyond.tl.tokens_col": {"zh": "token 数", "en": "tokens"},
    "beyond.tl.steps_col": {"zh": "交付次数", "en": "deliveries"},
    "beyond.tl.caption": {
        "zh": "灰条是等第一个 token 的时间（TTFT，含排队和预填充）；每个点是一次交付，点越大这一步到的 token 越多，"
              "数字标出投机一次交付的个数。TPOT = (末 token − 首 token) ÷ (token 数 − 1)，把时间摊到每个 token；"
              "ITL 是相邻两次交付的间隔。投机让 TPOT 下降，而 ITL 约等于一轮起草 + 验证。"
              "时间是引擎逐步记下的计算时间，这台 CPU 上的小模型，绝对值不能拿去和 GPU 比。",
        "en": "The grey bar is the wait for the first token (TTFT, queueing and prefill "
              "included); each dot is one delivery, larger when the step brought more tokens, "
              "with the count written on speculation's bursts. TPOT = (last − first token) ÷ "
              "(tokens − 1) spreads the time over every token; ITL is the gap between two "
              "deliveries. Speculation lowers TPOT, while an ITL is about one round of draft + "
              "verify. Times are the engine's per-step clock, a small model on this CPU: do not "
              "compare their absolute values with a GPU's."},
    # 4. one request's blocks
    "beyond.blk.header": {"zh": "一个请求的 KV 块的一生", "en": "One request's KV blocks through their life"},
    "beyond.blk.source": {
        "zh": "本机实时：下面每一行都是把引擎自己的分页分配器（engine/kv/paged.py，开启前缀缓存，块大小 4 个 token）"
              "按剧本驱动一遍后的真实状态，不是画出来的示意。格子里是物理块号和引用计数（×n 表示有 n 个请求持有它）。",
        "en": "Live on this machine: each row is the real state of the engine's own paged "
              "allocator (engine/kv/paged.py, prefix caching on, blocks of 4 tokens) driven "
              "through the script below, not a drawing. A cell shows the physical block and its "
              "reference count (×n: n requests hold it)."},
    "beyond.blk.logical": {"zh": "逻辑块（请求里的第几块）", "en": "logical block (position in the request)"},
    "beyond.blk.mark.new": {"zh": "按需新分配", "en": "allocated on demand"},
    "beyond.blk.mark.prefix": {"zh": "前缀缓存命中", "en": "prefix-cache hit"},
    "beyond.blk.mark.shared": {"zh": "与第二个样本共享", "en": "shared with the second sample"},
    "beyond.blk.mark.copied": {"zh": "写时复制", "en": "copied on write"},
    "beyond.blk.mark.held": {"zh": "照旧持有", "en": "held as before"},
    "beyond.blk.mark.freed": {"zh": "被抢占时释放", "en": "released on preemption"},
    "beyond.blk.mark.recomputed": {"zh": "重新计算", "en": "recomputed"},
    "beyond.blk.event.admit": {"zh": "1 到达", "en": "1 arrives"},
    "beyond.blk.event.fork": {"zh": "2 n = 2", "en": "2 n = 2"},
    "beyond.blk.event.cow": {"zh": "3 写入", "en": "3 writes"},
    "beyond.blk.event.grow": {"zh": "4 增长", "en": "4 grows"},
    "beyond.blk.event.preempt": {"zh": "5 抢占", "en": "5 preempted"},
    "beyond.blk.event.recompute": {"zh": "6 回来", "en": "6 comes back"},
    "beyond.blk.explain.admit": {
        "zh": "之前一个请求用过同样的系统提示词，它的两个满块留在缓存里：本请求直接引用它们，只为剩下的 3 个 token 新分配一块。",
        "en": "An earlier request had the same system prompt and its two full blocks stayed "
              "cached: this request takes them by reference and gets one fresh block for its "
              "last 3 tokens."},
    "beyond.blk.explain.fork": {
        "zh": "要两个样本（n = 2）：第二个样本不复制 KV，只让每个块的引用计数加一。",
        "en": "Two samples (n = 2): the second copies no KV; each block's reference count goes up by one."},
    "beyond.blk.explain.cow": {
        "zh": "第一个新 token 要写进最后那个没满、又被共享的块：先复制一份给自己再写（写时复制）；满块不会再被写，继续共享。",
        "en": "The first new token must go into the last block, partly filled and shared: the "
              "request first gets its own copy (copy on write); full blocks are never written "
              "again and stay shared."},
    "beyond.blk.explain.grow": {
        "zh": "解码把这一块写满后，下一个 token 到来时才按需分配新块。",
        "en": "Decoding fills that block; only when the next token comes is a new block allocated, on demand."},
    "beyond.blk.explain.preempt": {
        "zh": "显存紧张，调度器让它让位（重算式抢占）：它的块全部释放，引用计数减一；满块的内容还留在前缀缓存里，直到被别人用掉。",
        "en": "Memory runs short and the scheduler asks it to step out (preemption by "
              "recompute): every block is released, each count down by one; full blocks keep "
              "their content in the prefix cache until someone else needs the space."},
    "beyond.blk.explain.recompute": {
        "zh": "回来时把已有的 token 当作提示词重新预填充：缓存里还在的满块直接命中，只有最后没满的那块要重新计算。",
        "en": "Back again, its tokens so far are prefilled again as if they were a prompt: full "
              "blocks still cached are hits, and only the last, partial block is recomputed."},
})
