"""`python -m engine.spec.data.make_prompts`: write `train_prompts_more.jsonl`, seeded.

The apprentice (engine/spec/eagle.py) learns from the target's answers to the training
prompts, and what it lacks most is variety: measured with `engine.spec.train_draft.train`
(250 steps, held-out first-draft agreement), half of the 206 hand-written prompts gave 0.37,
all of them 0.46, while three more sampled answers to the same prompts gave 0.47. So more
*distinct* prompts, of the same three kinds and the same shapes as the hand-written ones:

- `grounded`: a small Python function (one of `FUNCTIONS`) with an edit to make and return
  (rename, type hints, docstring, logging, comments), records to convert (JSON, YAML,
  Markdown tables), lists to number, sort or capitalize, sentences to correct or quote;
- `open`: stories, poems, letters, dialogues, descriptions and brainstorms on `TOPICS`;
- `chat`: questions on `SUBJECTS`.

Every choice comes from `random.Random(SEED)`, so the file is the same on every machine;
`tests/engine/test_spec_eagle.py` checks that no prompt repeats and none is a benchmark prompt.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 64
OUT = Path(__file__).parent / "train_prompts_more.jsonl"

# name, parameters, body (4-space indented lines), one variable to rename
FUNCTIONS = [
    ("count_words", "text", ["n = 0", "for word in text.split():", "    n = n + 1", "return n"], "n"),
    ("largest", "values", ["best = values[0]", "for v in values:", "    if v > best:",
                           "        best = v", "return best"], "best"),
    ("average_speed", "distance, hours", ["s = distance / hours",
                                          "print('speed', s)", "return s"], "s"),
    ("celsius_to_fahrenheit", "c", ["f = c * 9 / 5 + 32", "return f"], "f"),
    ("is_even", "number", ["r = number % 2", "return r == 0"], "r"),
    ("join_names", "first, last", ["full = first + ' ' + last", "return full.strip()"], "full"),
    ("total_weight", "boxes", ["w = 0", "for box in boxes:", "    w += box['weight']",
                               "return w"], "w"),
    ("reverse_text", "text", ["out = ''", "for ch in text:", "    out = ch + out",
                              "return out"], "out"),
    ("count_vowels", "word", ["k = 0", "for ch in word.lower():", "    if ch in 'aeiou':",
                              "        k += 1", "return k"], "k"),
    ("area_of_rectangle", "width, height", ["a = width * height",
                                            "print('area is', a)", "return a"], "a"),
    ("first_positive", "numbers", ["for x in numbers:", "    if x > 0:", "        return x",
                                   "return None"], "x"),
    ("price_with_tax", "price, rate", ["t = price * rate / 100", "total = price + t",
                                       "return round(total, 2)"], "t"),
    ("merge_lists", "a, b", ["result = []", "for item in a + b:",
                             "    if item not in result:", "        result.append(item)",
                             "return result"], "result"),
    ("read_lines", "path", ["with open(path) as fh:", "    lines = fh.readlines()",
                            "print('read', len(lines), 'lines')", "return lines"], "lines"),
    ("factorial", "n", ["p = 1", "for i in range(2, n + 1):", "    p = p * i", "return p"], "p"),
    ("grade", "score", ["if score >= 90:", "    g = 'A'", "elif score >= 75:", "    g = 'B'",
                        "else:", "    g = 'C'", "return g"], "g"),
    ("minutes_to_hours", "minutes", ["h = minutes // 60", "m = minutes % 60",
                                     "return f'{h}h {m}m'"], "h"),
    ("shopping_total", "items, prices", ["s = 0", "for item in items:",
                                         "    s += prices[item]", "print('total', s)",
                                         "return s"], "s"),
    ("clamp", "value, low, high", ["v = max(low, value)", "v = min(high, v)", "return v"], "v"),
    ("initials", "name", ["parts = name.split()", "out = ''", "for p in parts:",
                          "    out += p[0].upper()", "return out"], "out"),
    ("count_lines", "text", ["c = text.count('\\n')", "return c + 1"], "c"),
    ("distance", "x1, y1, x2, y2", ["dx = x2 - x1", "dy = y2 - y1",
                                    "return (dx * dx + dy * dy) ** 0.5"], "dx"),
    ("squares", "n", ["out = []", "for i in range(n):", "    out.append(i * i)",
                      "return out"], "out"),
    ("save_score", "path, score", ["line = str(score) + '\\n'", "with open(path, 'a') as fh:",
                                   "    fh.write(line)", "print('saved', score)"], "line"),
    ("discount", "price, pct", ["d = price * pct / 100", "return price - d"], "d"),
    ("longest_word", "words", ["best = ''", "for w in words:", "    if len(w) > len(best):",
                               "        best = w", "return best"], "best"),
    ("fizz", "n", ["out = []", "for i in range(1, n + 1):", "    if i % 3 == 0:",
                   "        out.append('fizz')", "    else:", "        out.append(str(i))",
                   "return out"], "out"),
    ("bmi", "weight, height", ["b = weight / (height * height)", "print('bmi', b)",
                               "return round(b, 1)"], "b"),
]

CODE_TASKS = [
    "Rename the variable `{var}` to `{new}` in this function and return the whole function:",
    "Add type hints to this function and return the whole function:",
    "Add a docstring to this function and return the full code:",
    "Add a comment above every line of this function and return it:",
    "Rename the function to `{fn2}` and return the whole code:",
]
LOGGING_TASK = "Change every `print` call to `logging.info` in this code and return it:"
NEW_NAMES = ["total", "result", "value", "count", "amount", "answer", "acc", "current"]

FIRST = ["Anna", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jia",
         "Kofi", "Lea", "Mateo", "Nora", "Omar", "Priya", "Quinn", "Rosa", "Sven", "Tariq",
         "Uma", "Victor", "Wen", "Yara", "Zoe"]
CITIES = ["Lima", "Oslo", "Nairobi", "Seoul", "Lyon", "Austin", "Porto", "Hanoi", "Quito",
          "Dublin", "Perth", "Accra", "Bergen", "Kyoto", "Tunis", "Graz"]
JOBS = ["teacher", "nurse", "pilot", "chef", "developer", "artist", "farmer", "lawyer",
        "baker", "editor"]
ITEMS = ["carrots", "yogurt", "pasta", "onions", "butter", "lentils", "oranges", "tea",
         "flour", "spinach", "honey", "peppers", "oats", "soap", "batteries", "candles",
         "stamps", "tape", "glue", "string", "paper", "markers", "envelopes", "plates"]
SENTENCES = [
    "The museum opens at nine and closes at six, except on Mondays when it stays closed.",
    "Our team finished the bridge model two days early, and the teacher gave us extra points.",
    "The train to the coast was late again, so we walked along the river and bought ice cream.",
    "My grandmother grows tomatoes, beans and sunflowers in a small garden behind her house.",
    "The concert in the park was cancelled because of the storm, but it will happen next week.",
    "He repaired the old radio with a new battery and a piece of copper wire.",
    "The library will lend laptops to students during the exam period starting in June.",
    "We cooked soup for the whole class and everyone asked for the recipe afterwards.",
    "The bakery on the corner sells fresh bread every morning at seven o'clock.",
    "After the rain stopped, the children ran outside to look for snails and rainbows.",
    "The company moved its office to a quieter street near the central station last year.",
    "She practised the piano every evening and played the whole sonata at the school concert.",
]
EVENTS = [("the Science Fair", "Madrid", "Professor Alan Brooks"),
          ("the Harvest Festival", "Kraków", "Mayor Ewa Nowak"),
          ("the Robotics Cup", "Osaka", "engineer Kenji Mori"),
          ("the Poetry Night", "Dublin", "writer Siobhan Kelly"),
          ("the Chess Open", "Tbilisi", "grandmaster Nino Beridze"),
          ("the Food Expo", "Lagos", "chef Amaka Obi"),
          ("the Climate Summit", "Quito", "Dr. Lucía Paredes"),
          ("the Film Week", "Busan", "director Min-jun Park")]
MONTHS = ["January", "February", "April", "May", "June", "July", "August", "September",
          "October", "November", "December"]

TOPICS = ["a fox who opens a library", "a girl who can talk to trees", "an old clock tower",
          "a robot gardener", "a snowy mountain village", "a lost umbrella", "a friendly ghost",
          "the first day of school", "a train that travels through time", "a whale who sings",
          "a tiny island with one tree", "a bakery at midnight", "a brave little turtle",
          "a city under the sea", "a kite that would not come down", "a winter market",
          "a boy who collects clouds", "the last bookshop on Earth", "a desert at sunrise",
          "a painter who loses her colours", "a squirrel planning a heist", "a rainy Monday",
          "a spaceship made of paper", "an elephant who learns to swim", "a forgotten toy",
          "a lighthouse keeper's cat", "two rival chefs", "a village without music",
          "a bicycle that can fly", "a snowman in spring", "a dragon who runs a tea shop",
          "the moon taking a holiday", "a bee who is afraid of flowers", "a magic backpack",
          "a night train across the desert", "a penguin in the city", "an old fisherman",
          "a garden on a rooftop", "a mountain that moves", "a cat who becomes mayor"]
OPEN_FORMS = [("Write a short story about {}.", 160), ("Write a short poem about {}.", 110),
              ("Write a letter from {} to a friend.", 140), ("Describe {} in detail.", 130),
              ("Write a funny dialogue about {}.", 140), ("Tell a bedtime story about {}.", 160),
              ("Write the opening paragraph of a novel about {}.", 120)]
BRAINSTORM = ["names for a bookshop that sells only maps", "ways to save water at home",
              "games to play on a long car ride", "themes for a school dance",
              "uses for an empty glass jar", "gifts for a grandmother who loves gardening",
              "names for a robot vacuum", "ideas for a rainy Saturday", "slogans for a bakery",
              "ways to make a small room feel bigger", "science projects about magnets",
              "names for a band of penguins", "healthy snacks for a hike",
              "ideas for a birthday party in the park", "ways to learn new words every day",
              "mascots for a football team from the mountains", "recipes that use bananas",
              "questions to ask at a job interview", "names for a cafe on a boat",
              "ways to celebrate the first day of spring"]
SUBJECTS = ["volcanoes", "the moon's phases", "rainbows", "vaccines", "earthquakes", "tides",
            "batteries", "the internet", "compound interest", "black holes", "bread rising",
            "glaciers", "solar panels", "the immune system", "magnets", "airplanes flying",
            "clouds forming", "recycling plastic", "the seasons", "sleep", "coffee",
            "hurricanes", "electric cars", "the stock market", "languages changing",
            "fireworks", "coral reefs", "thunder", "refrigerators", "muscles growing",
            "the printing press", "credit scores", "microwaves", "bird migration",
            "time zones", "the heart", "wind turbines", "soap", "email", "yeast"]
CHAT_FORMS = [("Explain {} simply.", 140), ("Why is it useful to understand {}?", 130),
              ("Explain {} to a ten-year-old.", 140),
              ("What are three surprising facts about {}?", 130),
              ("Write a short explanation of {} for a school newsletter.", 140)]
ADVICE = ["learning to cook", "running a first 5 km race", "keeping a plant alive",
          "writing a cover letter", "saving money as a student", "speaking in public",
          "starting to learn the guitar", "travelling on a small budget", "sleeping better",
          "making friends in a new city", "learning to type faster", "packing for a move",
          "taking better photos with a phone", "staying focused while studying at home",
          "preparing for a job interview"]


def _function(rng: random.Random, fn) -> tuple[str, str]:
    name, params, body, var = fn
    code = f"def {name}({params}):\n" + "\n".join("    " + line for line in body)
    tasks = list(CODE_TASKS) + ([LOGGING_TASK] if any("print(" in b for b in body) else [])
    task = rng.choice(tasks).format(var=var, new=rng.choice([n for n in NEW_NAMES if n != var]),
                                    fn2="compute_" + name.split("_")[-1])
    return f"{task}\n\n```python\n{code}\n```", task


def _records(rng: random.Random) -> str:
    people = rng.sample(FIRST, rng.randint(3, 5))
    rows = [(p, rng.choice(JOBS), rng.choice(CITIES), rng.randint(21, 64)) for p in people]
    form = rng.randrange(4)
    if form == 0:
        obj = {"name": rows[0][0], "job": rows[0][1], "city": rows[0][2], "age": rows[0][3],
               "hobbies": rng.sample(["chess", "cycling", "drawing", "hiking", "singing"], 2)}
        return "Convert this JSON to YAML:\n\n" + json.dumps(obj, ensure_ascii=False)
    if form == 1:
        svc = rng.choice(["api", "worker", "cache", "web"])
        return ("Convert this YAML to JSON:\n\n"
                f"service:\n  name: {svc}\n  port: {rng.choice([80, 3000, 5432, 8000, 9090])}\n"
                f"owner:\n  name: {rows[0][0]}\n  city: {rows[0][2]}\n"
                f"replicas: {rng.randint(1, 6)}")
    lines = "\n".join(f"- {n}, {j}, {c}" for n, j, c, _ in rows)
    if form == 2:
        return ("Rewrite this list of people as a Markdown table with columns Name, Job and "
                f"City:\n\n{lines}")
    return "Write these people as a JSON list of objects with keys name, job, city and age:\n\n" \
        + "\n".join(f"{n} is a {j} in {c}, aged {a}." for n, j, c, a in rows)


def _list_task(rng: random.Random) -> str:
    items = rng.sample(ITEMS, rng.randint(6, 10))
    task = rng.choice(["Repeat this shopping list with each item numbered:",
                       "Sort these words alphabetically and write them one per line:",
                       "Write this list in capital letters, one item per line:",
                       "Put these items into two groups, food and other, and list each group:"])
    sep = "\n" if "Repeat" in task else ", "
    return f"{task}\n\n{sep.join(items)}"


def _misspell(rng: random.Random, sentence: str) -> str:
    words = sentence.split()
    for i in rng.sample(range(len(words)), k=min(4, len(words))):
        w = words[i]
        if len(w) > 4 and w.isalpha():
            j = rng.randrange(1, len(w) - 2)
            words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]  # swap two letters
    return " ".join(words)


def _text_task(rng: random.Random) -> str:
    form = rng.randrange(3)
    if form == 0:
        text = " ".join(_misspell(rng, s) for s in rng.sample(SENTENCES, 2))
        return f"Fix the spelling mistakes in this text and write it out again:\n\n{text}"
    if form == 1:
        event, city, person = rng.choice(EVENTS)
        day, month, year = rng.randint(1, 28), rng.choice(MONTHS), rng.randint(2015, 2025)
        return ("Extract the event, date, place and speaker from this paragraph and list them "
                f"as 'field: value' lines:\n\nOn {day} {month} {year}, {person} opened {event} "
                f"in {city}. {rng.choice(SENTENCES)}")
    text = " ".join(rng.sample(SENTENCES, 3))
    return ("Repeat this paragraph in full, then write one sentence saying what it is "
            f"about:\n\n{text}")


def make(seed: int = SEED) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    for fn in FUNCTIONS:  # each function with up to three edits (repeats dropped below)
        for _ in range(3):
            out.append({"kind": "grounded", "prompt": _function(rng, fn)[0], "max_tokens": 130})
    for _ in range(40):
        out.append({"kind": "grounded", "prompt": _records(rng), "max_tokens": 110})
    for _ in range(30):
        out.append({"kind": "grounded", "prompt": _list_task(rng), "max_tokens": 80})
    for _ in range(40):
        out.append({"kind": "grounded", "prompt": _text_task(rng), "max_tokens": 110})
    for topic in TOPICS:
        for form, n in rng.sample(OPEN_FORMS, 3):
            out.append({"kind": "open", "prompt": form.format(topic), "max_tokens": n})
    for what in BRAINSTORM:
        k = rng.choice(["five", "eight", "ten"])
        out.append({"kind": "open", "prompt": f"Brainstorm {k} {what}.", "max_tokens": 110})
    for subject in SUBJECTS:
        for form, n in rng.sample(CHAT_FORMS, 2):
            out.append({"kind": "chat", "prompt": form.format(subject), "max_tokens": n})
    for topic in ADVICE:
        out.append({"kind": "chat", "prompt": f"Give me practical tips for {topic}.",
                    "max_tokens": 140})
    # not a hand-written prompt again, nor any prompt twice
    hand = OUT.with_name("train_prompts.jsonl").read_text(encoding="utf-8").splitlines()
    seen: set[str] = {json.loads(line)["prompt"] for line in hand if line.strip()}
    unique = []
    for it in out:
        if it["prompt"] not in seen:
            seen.add(it["prompt"])
            unique.append(it)
    return unique


def main() -> int:
    items = make()
    OUT.write_text("".join(json.dumps(it, ensure_ascii=False) + "\n" for it in items),
                   encoding="utf-8")
    print(f"wrote {len(items)} prompts to {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
