"""Named workloads and arrival processes: what the servers are asked to do.

Chapter 6.4 opens with an experiment: serve a model with "ten lines of transformers", then
with a real serving engine, load both with the same traffic, and compare. The traffic
matters as much as the server. Each leak shows up only under the workload that opens it:

- `longtail`: chat traffic, many short answers and a few long ones. Static batches keep
  finished riders in their seats until the longest answer ends (leak one, the tour bus).
- `uniform`: every answer has the same length, the control experiment. Static and
  continuous batching should come out close.
- `shared-prefix`: one long system prompt before short questions, for prefix caching.
- `grounded`: answers that copy from the prompt (code edits, JSON to YAML, field
  extraction), where n-gram speculation (prompt lookup) guesses well (leak three).
- `open`: stories, poems and brainstorming, where copying from the prompt rarely helps.
- `chat`: short questions whose answers end at EOS well before a generous `max_tokens`.
  The only preset that stops at EOS: a contiguous layout reserves prompt + `max_tokens`
  for each request, and most of that reservation is never written (leak two as the
  PagedAttention paper measured it), while a paged layout holds only what was written.

Prompts are plain text, tokenized as they are (no chat template is applied), so each one
carries SmolLM2's chat markup itself and a small instruct model answers sensibly. Every
item sets `ignore_eos=True` by default: every system then computes exactly `max_tokens`
per request and the comparison counts identical work; `chat` alone lets answers end at EOS,
because what it shows is memory reserved for tokens that never come.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

ARRIVAL_MODES = ("all-at-once", "poisson")


@dataclass
class WorkItem:
    """One request of a workload."""

    prompt: str  # plain text, tokenized as it is
    max_tokens: int  # output tokens to generate
    ignore_eos: bool = True  # keep generating past <|im_end|>, so every system does equal work
    arrival_s: float = 0.0  # seconds after the run starts when the request arrives
    name: str = ""  # a short label for charts and tables, unique within a workload


@dataclass
class Workload:
    """A named list of requests with a bilingual one-line description."""

    name: str
    description_en: str
    description_zh: str
    items: list[WorkItem] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    @property
    def prompts(self) -> list[str]:
        return [it.prompt for it in self.items]

    @property
    def max_tokens(self) -> list[int]:
        return [it.max_tokens for it in self.items]

    @property
    def total_max_tokens(self) -> int:
        return sum(self.max_tokens)


# Prompts of every kind the model meets (prose, code, Chinese, chat markup, SQL) for checks of
# the engine's numbers against a reference, token by token (the tests; kernel_bench --kv-quality)
PROBE_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "我最喜欢的水果是",
    "Once upon a time, in a small village at the edge of a dark forest, there lived",
    "<|im_start|>user\nList three primary colors.<|im_end|>\n<|im_start|>assistant\n",
    "SELECT name, age FROM users WHERE",
    "请用一句话解释什么是机器学习：",
]


def chat(user: str, system: str | None = None) -> str:
    """SmolLM2's chat markup around one user turn, ending where the assistant starts."""
    head = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
    return f"{head}<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"


# ---------------------------------------------------------------------------------------------
# Prompt pools. Lengths vary on purpose: a padded static batch pays for its longest prompt.

# Questions whose natural answer is a sentence or two.
SHORT_ANSWER = [
    "What is the capital of Australia?",
    "Give me a synonym for 'happy'.",
    "How many legs does a spider have?",
    "Translate 'good morning' into French.",
    "What does CPU stand for?",
    "Is a tomato a fruit or a vegetable? Answer briefly.",
    "用一句话介绍长城。",
    "水的沸点是多少摄氏度？",
    "What year did the first person walk on the Moon?",
    "Suggest a name for a grey kitten.",
    "What is the difference between weather and climate, in one sentence?",
    "In Python, how do I get the length of a list?",
    "What does this print?\n\n```python\nprint(sum(range(5)))\n```",
    "Convert 5 kilometres to miles.",
    "I have a meeting at 3 pm and it lasts 45 minutes. When does it end?",
    "Name a famous painting by Vincent van Gogh.",
    "My code says `IndexError: list index out of range`. What does that usually mean?",
    "What is the plural of 'mouse'?",
    "推荐一本适合初学者的编程书。",
    "Which planet is closest to the Sun?",
]

# Questions SmolLM2-135M answers and ends at EOS well within CHAT_MAX_TOKENS under greedy
# decoding (the Chinese and open-ended questions above ramble past any cap, so they are left
# out: this pool's answers must end on their own).
CHAT = [q for q in SHORT_ANSWER if q.isascii() and "length of a list" not in q
        and "painting" not in q and "IndexError" not in q]
CHAT_MAX_TOKENS = 256  # generous: the reservation a contiguous layout makes for each answer

# Requests that invite a long answer: explanations, code, plans.
LONG_ANSWER = [
    "Explain how a computer's memory hierarchy works, from registers to disk, and why caches "
    "make programs faster. Use simple examples.",
    "Write a Python function that reads a CSV file of students and their grades, computes each "
    "student's average, and prints the top three. Explain each step.",
    "I am planning a three-day trip to Kyoto in autumn. Suggest an itinerary with temples, food "
    "and a day trip, and give practical tips about transport.",
    "请详细解释什么是机器学习，它和传统编程有什么不同，并举两个日常生活中的例子。",
    "Compare renting and buying a home. Discuss costs, flexibility, risks, and who each option "
    "suits best.",
    "Explain step by step how to solve the equation 3x + 7 = 22, then explain how to check "
    "the answer, as if teaching a twelve-year-old.",
    "Write a short guide for a new team member on how to write a good bug report, with an "
    "example of a bad report and a good one.",
    "Describe the water cycle in detail: evaporation, condensation, precipitation and "
    "collection. Why does it matter for agriculture?",
]

# A long shared system prompt (about 250 tokens) for the prefix-caching workload.
SHARED_SYSTEM = (
    "You are Mei, the customer support assistant of Lumen Books, an online bookshop. "
    "Follow these rules in every answer.\n"
    "1. Be polite, warm and brief: answer in at most three sentences unless asked for more.\n"
    "2. Shipping: orders over 35 dollars ship free within the country. Standard shipping takes "
    "three to five working days; express shipping costs 9 dollars and takes one to two days. "
    "We ship abroad to 40 countries; international delivery takes seven to fourteen days.\n"
    "3. Returns: books can be returned within 30 days in their original condition for a full "
    "refund. E-books cannot be returned once downloaded. Damaged items are replaced for free; "
    "ask the customer for a photo and the order number.\n"
    "4. Payment: we accept credit cards, PayPal and gift cards. We never ask for a full card "
    "number in chat.\n"
    "5. Membership: the Lumen Club costs 20 dollars a year and gives 10 percent off every "
    "order, free express shipping, and early access to signed editions.\n"
    "6. Opening hours of the support team: Monday to Saturday, 8 am to 8 pm.\n"
    "7. If you do not know the answer, say so and offer to connect the customer with a human "
    "colleague. Never invent order details.\n"
    "8. End every answer by asking whether there is anything else you can help with."
)

SHARED_QUESTIONS = [
    "How long does express shipping take?",
    "Can I return an e-book I bought yesterday?",
    "My book arrived with a torn cover. What should I do?",
    "Do you ship to Canada?",
    "Is the Lumen Club worth it if I buy a book every month?",
    "Which payment methods do you accept?",
    "Are you open on Sunday?",
    "How much does shipping cost for a 20 dollar order?",
    "Can I pay with a gift card and PayPal together?",
    "Where is my order 48213?",
    "I want to return a book I bought five weeks ago.",
    "Do members get signed editions early?",
    "你们支持国际配送吗？",
    "What happens if I am not home when the parcel arrives?",
    "Can you recommend a good mystery novel?",
    "How do I cancel my Lumen Club membership?",
]

# Copy-heavy tasks: most of the answer is already in the prompt. The first ones are those
# SmolLM2-135M copies most faithfully under greedy decoding, so a run of one or two requests
# (the class's low-load case) is a copying one.
GROUNDED = [
    (
        "Convert this JSON to YAML:\n\n"
        '{"name": "Alice", "age": 30, "city": "Paris", "languages": ["French", "English"], '
        '"employed": true, "team": "data"}',
        64,
    ),
    (
        "Extract the name, date, and location from this paragraph and list them as "
        "'field: value' lines:\n\n"
        "On 14 March 2023, Dr. Maria Gonzalez presented her research on coral reefs at the "
        "Marine Biology Conference in Lisbon, Portugal. Her talk drew more than 300 people.",
        64,
    ),
    (
        "Add type hints to this function and return the full code:\n\n"
        "```python\ndef greet(name, times):\n    result = []\n    for i in range(times):\n"
        "        result.append('Hello, ' + name)\n    return result\n```",
        96,
    ),
    (
        "Fix the spelling mistakes in this text and write it out again:\n\n"
        "Yesterday I went to the libary to borow a book about the histroy of Rome. The "
        "librarian was very helpfull and showed me were the books are.",
        64,
    ),
    (
        "Rewrite this list of people as a Markdown table with columns Name, Role and City:\n\n"
        "- Tom, engineer, Berlin\n- Sara, designer, Madrid\n- Ken, manager, Tokyo\n"
        "- Lina, analyst, Cairo",
        96,
    ),
    (
        "Change every `print` call to `logging.info` in this code and return it:\n\n"
        "```python\ndef load(path):\n    print('loading', path)\n    with open(path) as f:\n"
        "        data = f.read()\n    print('read', len(data), 'bytes')\n    return data\n```",
        128,
    ),
    (
        "Convert this YAML to JSON:\n\n"
        "server:\n  host: localhost\n  port: 8080\ndatabase:\n  user: admin\n  name: shop\n"
        "  pool: 5",
        64,
    ),
    (
        "Sort these words alphabetically and write them one per line:\n\n"
        "pear, apple, mango, kiwi, banana, cherry, grape, lemon",
        64,
    ),
    (
        "Quote the sentence from this paragraph that mentions the price, then repeat the "
        "paragraph in full:\n\nThe new phone has a bright screen and a long battery life. It "
        "costs 499 dollars and comes in three colours. Sales start next Friday in most stores.",
        128,
    ),
    (
        "Translate the comments in this code into English and return the whole code:\n\n"
        "```python\n# 计算平均值\ndef mean(xs):\n    # 空列表返回 0\n    if not xs:\n"
        "        return 0\n    return sum(xs) / len(xs)\n```",
        96,
    ),
    (
        "Rename the variable `x` to `total` in this function and return the whole function:\n\n"
        "```python\ndef add_prices(prices):\n    x = 0\n    for p in prices:\n        x = x + p\n"
        "    if x > 100:\n        print('big order')\n    return x\n```",
        96,
    ),
    (
        "Repeat this shopping list with each item numbered:\n\n"
        "apples\nbread\nmilk\neggs\ncheese\ntomatoes\nrice\nolive oil\ncoffee\nbananas",
        64,
    ),
]

# Creative tasks: little of the answer can be copied from the prompt.
OPEN = [
    ("Write a short story about a robot who learns to bake bread.", 128),
    ("Write a poem about the ocean at night.", 96),
    ("Brainstorm ten names for a coffee shop run by cats.", 96),
    ("写一首关于春天的短诗。", 96),
    ("Invent a new board game and describe how to play it.", 128),
    ("Write a letter from a lighthouse keeper to their future self.", 128),
    ("Give me five ideas for a science fair project about plants.", 96),
    ("Describe a city on Mars two hundred years from now.", 128),
    ("Write a funny dialogue between a cat and a vacuum cleaner.", 128),
    ("Write a haiku about autumn leaves, then explain the imagery.", 64),
    ("Brainstorm slogans for a bicycle repair shop.", 64),
    ("Tell a bedtime story about a dragon who is afraid of the dark.", 128),
]


# ---------------------------------------------------------------------------------------------
# Presets


def _longtail(n: int, seed: int) -> list[WorkItem]:
    """Most answers short (8-32 tokens), about one in eight long (128-200), like chat traffic."""
    rng = random.Random(seed)
    num_long = max(1, round(n / 8)) if n >= 2 else 0
    long_slots = set(rng.sample(range(n), num_long))
    items = []
    short_i = long_i = 0
    for i in range(n):
        if i in long_slots:
            prompt = LONG_ANSWER[long_i % len(LONG_ANSWER)]
            long_i += 1
            max_tokens = rng.randint(128, 200)
        else:
            prompt = SHORT_ANSWER[(short_i + seed) % len(SHORT_ANSWER)]
            short_i += 1
            max_tokens = rng.randint(8, 32)
        items.append(WorkItem(chat(prompt), max_tokens, name=f"longtail-{i:02d}"))
    return items


def _uniform(n: int, seed: int) -> list[WorkItem]:
    pool = SHORT_ANSWER + LONG_ANSWER
    return [WorkItem(chat(pool[(i + seed) % len(pool)]), 64, name=f"uniform-{i:02d}")
            for i in range(n)]


def _shared_prefix(n: int, seed: int) -> list[WorkItem]:
    qs = SHARED_QUESTIONS
    return [WorkItem(chat(qs[(i + seed) % len(qs)], system=SHARED_SYSTEM), 48,
                     name=f"shared-{i:02d}") for i in range(n)]


def _cycle(pool: list[tuple[str, int]], prefix: str, n: int, seed: int) -> list[WorkItem]:
    return [WorkItem(chat(pool[(i + seed) % len(pool)][0]), pool[(i + seed) % len(pool)][1],
                     name=f"{prefix}-{i:02d}") for i in range(n)]


def _chat(n: int, seed: int) -> list[WorkItem]:
    return [WorkItem(chat(CHAT[(i + seed) % len(CHAT)]), CHAT_MAX_TOKENS, ignore_eos=False,
                     name=f"chat-{i:02d}") for i in range(n)]


# name -> (builder(n, seed), default n, description_en, description_zh)
PRESETS = {
    "longtail": (
        _longtail, 32,
        "Chat traffic: many short answers (8-32 tokens) and a few long ones (128-200).",
        "聊天流量：大多数回答很短（8–32 个 token），少数很长（128–200）。",
    ),
    "uniform": (
        _uniform, 16,
        "Every answer is 64 tokens long: the control experiment.",
        "所有回答都是 64 个 token：对照实验。",
    ),
    "shared-prefix": (
        _shared_prefix, 16,
        "One long shared system prompt (~250 tokens), then short customer questions.",
        "同一段很长的系统提示词（约 250 个 token），后面跟不同的简短客服问题。",
    ),
    "grounded": (
        lambda n, seed: _cycle(GROUNDED, "grounded", n, seed), len(GROUNDED),
        "Copy-heavy tasks (code edits, JSON to YAML, extraction): answers reuse prompt text.",
        "照抄型任务（改代码、JSON 转 YAML、信息抽取）：回答大量复用提示词里的文字。",
    ),
    "open": (
        lambda n, seed: _cycle(OPEN, "open", n, seed), len(OPEN),
        "Creative tasks (stories, poems, brainstorming): little to copy from the prompt.",
        "开放式创作（故事、诗歌、头脑风暴）：回答几乎无法从提示词里照抄。",
    ),
    "chat": (
        _chat, 16,
        "Short chat questions: answers end at EOS, far below a generous 256-token cap.",
        "简短问答：回答在 EOS 处自然结束，远不到宽裕的 256 个 token 上限。",
    ),
}
WORKLOAD_NAMES = tuple(PRESETS)


def get_workload(name: str, n: int | None = None, seed: int = 0,
                 max_tokens_scale: float = 1.0) -> Workload:
    """A preset by name. `n` truncates or cycles to n requests; `seed` picks the draw
    (longtail's lengths, every preset's starting prompt); `max_tokens_scale` stretches or
    shrinks every answer (at least 1 token)."""
    if name not in PRESETS:
        raise ValueError(f"unknown workload {name!r}; choose one of {list(WORKLOAD_NAMES)}")
    build, default_n, en, zh = PRESETS[name]
    if n is None:
        n = default_n
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not (isinstance(max_tokens_scale, (int, float)) and math.isfinite(max_tokens_scale)
            and max_tokens_scale > 0):
        raise ValueError(f"max_tokens_scale must be a number > 0, got {max_tokens_scale!r}")
    items = build(n, seed)
    if max_tokens_scale != 1.0:
        items = [replace(it, max_tokens=max(1, round(it.max_tokens * max_tokens_scale)))
                 for it in items]
    return Workload(name, en, zh, items)


def load_jsonl(path: str | Path) -> Workload:
    """A workload from a JSONL file: one object per line with "prompt" (text) and
    "max_tokens" (integer >= 1); optional "ignore_eos" (bool, default true), "arrival_s"
    (seconds >= 0) and "name". Blank lines are skipped; other keys are ignored."""
    path = Path(path)
    items = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path.name} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"{where}: expected a JSON object, got {type(obj).__name__}")
            prompt = obj.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"{where}: field 'prompt' must be a non-empty string, "
                                 f"got {prompt!r}")
            max_tokens = obj.get("max_tokens")
            if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
                raise ValueError(f"{where}: field 'max_tokens' must be an integer >= 1, "
                                 f"got {max_tokens!r}")
            ignore_eos = obj.get("ignore_eos", True)
            if not isinstance(ignore_eos, bool):
                raise ValueError(f"{where}: field 'ignore_eos' must be true or false, "
                                 f"got {ignore_eos!r}")
            arrival = obj.get("arrival_s", 0.0)
            if (isinstance(arrival, bool) or not isinstance(arrival, (int, float))
                    or not math.isfinite(arrival) or arrival < 0):
                raise ValueError(f"{where}: field 'arrival_s' must be a number >= 0, "
                                 f"got {arrival!r}")
            name = obj.get("name", f"{path.stem}-{len(items):02d}")
            if not isinstance(name, str):
                raise ValueError(f"{where}: field 'name' must be a string, got {name!r}")
            items.append(WorkItem(prompt, max_tokens, ignore_eos, float(arrival), name))
    if not items:
        raise ValueError(f"{path.name}: no requests (the file has no non-blank lines)")
    return Workload(path.stem, f"Loaded from {path.name}", f"从 {path.name} 读入", items)


def with_arrivals(workload: Workload, mode: str = "all-at-once", rate: float | None = None,
                  seed: int = 0) -> Workload:
    """A copy of `workload` with arrival times set.

    "all-at-once": everyone is at the door at t = 0 (the offline benchmark).
    "poisson": a Poisson process of `rate` requests per second: exponential gaps with mean
    1 / rate. The first request arrives at t = 0 (as vLLM's serving benchmark sends its
    first request at once), so the run does not start idle.
    """
    if mode not in ARRIVAL_MODES:
        raise ValueError(f"mode must be one of {list(ARRIVAL_MODES)}, got {mode!r}")
    if mode == "all-at-once":
        times = [0.0] * len(workload.items)
    else:
        if (rate is None or isinstance(rate, bool) or not isinstance(rate, (int, float))
                or not math.isfinite(rate) or rate <= 0):
            raise ValueError(f"rate must be a number of requests per second > 0 for poisson "
                             f"arrivals, got {rate!r}")
        rng = random.Random(seed)
        times, t = [], 0.0
        for i in range(len(workload.items)):
            if i:
                t += rng.expovariate(rate)
            times.append(t)
    items = [replace(it, arrival_s=t) for it, t in zip(workload.items, times)]
    return replace(workload, items=items)
