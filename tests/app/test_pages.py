"""Every page of the app driven by streamlit's AppTest through app/main.py, on the real engine.

Slow (the bundled model, real steps on a CPU). The twelve switch combinations are stepped on the
dashboard; the other live pages are stepped once each and checked to follow the engine.
"""

from __future__ import annotations

import itertools
import pathlib
import sys
from html import escape as html_escape

import pytest
from streamlit.testing.v1 import AppTest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from app.live import SESSION_KEY  # noqa: E402
from app.pagelist import LIVE_PAGES, OWN_ENGINE_PAGES, PAGES  # noqa: E402
from app.spec_lab import FORWARD_SIZES  # noqa: E402
from app.state import MAX_PROMPT_CHARS  # noqa: E402

MAIN = str(ROOT / "app/main.py")
TIMEOUT = 120  # seconds per run: the machine is slow and shared
pytestmark = pytest.mark.slow


def start(lang: str = "en") -> AppTest:
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state["lang"] = lang
    return at.run()


def goto(at: AppTest, slug: str) -> AppTest:
    return at.switch_page(f"pages/{slug}.py").run()


def step(at: AppTest, n: int = 1) -> AppTest:
    for _ in range(n):
        at.button(key="ctl_step").click().run()
        assert not at.exception, at.exception[0].value
    return at


def switches(at: AppTest, batching: str, kv_layout: str, spec: str) -> AppTest:
    at.radio(key="sw_batching").set_value(batching)
    at.radio(key="sw_kv_layout").set_value(kv_layout)
    at.radio(key="sw_spec").set_value(spec)
    return at.run()


def html(at: AppTest) -> str:
    return "\n".join(h.value for h in at.html)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def session(at: AppTest):
    return at.session_state[SESSION_KEY]


@pytest.fixture(scope="module")
def app() -> AppTest:
    return start()




@pytest.mark.parametrize("slug", PAGES)
def test_every_page_loads(app, slug):
    at = goto(app, slug)
    assert not at.exception, at.exception[0].value
    assert at.title or at.markdown, f"{slug} drew nothing"
    assert any("7B model on a GPU" in c.value for c in at.caption), f"{slug}: no scale line"
    if slug in OWN_ENGINE_PAGES:  # the classroom drives the class server: no single-user controls
        assert not any(b.key == "ctl_step" for b in at.button)
        assert not any(r.key == "sw_batching" for r in at.radio)
        assert any("shared server" in c.value for c in at.sidebar.caption)
    elif slug in LIVE_PAGES:  # (AppTest runs the others without main.py; the browser test covers them)
        assert at.button(key="ctl_step"), "the sidebar is missing"


# every pair of switch values meets in make test's six (pairwise: each batching with each
# layout, each with each speculation method); make test-soak runs the other six as well
PAIRWISE = {("static", "contiguous", "off"), ("continuous", "paged", "off"),
            ("static", "paged", "ngram"), ("continuous", "contiguous", "ngram"),
            ("static", "contiguous", "draft"), ("continuous", "paged", "draft")}
COMBOS = [c if c in PAIRWISE else pytest.param(*c, marks=pytest.mark.soak)
          for c in itertools.product(("static", "continuous"), ("contiguous", "paged"),
                                     ("off", "ngram", "draft"))]


@pytest.mark.parametrize("batching,kv_layout,spec", COMBOS)
def test_dashboard_steps_ten_times_under_every_combination(batching, kv_layout, spec):
    at = goto(start(), "dashboard")
    at = switches(at, batching, kv_layout, spec)
    assert not at.exception, at.exception[0].value
    step(at, 10)
    run = session(at).primary
    cfg = run.engine.config
    assert (cfg.batching, cfg.kv_layout) == (batching, kv_layout)
    assert (cfg.spec.method if cfg.spec else "off") == spec
    assert run.step_count == 10 and len(run.history) == 10
    assert any("Step 10" in m.value for m in at.markdown)
    m = metrics(at)
    assert m["Throughput (tokens/s)"] != "—"
    assert m["Seats busy"].endswith("/ 8")
    if spec != "off":
        drafted = sum(len(rec["drafted"]) for rep in run.history for rec in rep["spec"])
        assert drafted == 0 or m["Acceptance rate"].endswith("%")
    else:
        assert m["Acceptance rate"] == "—"


def test_batching_page_seats_follow_the_engine_side_by_side():
    at = goto(start(), "batching")
    assert "12 requests wait at the door" in " ".join(i.value for i in at.info)
    step(at)
    first = html(at)
    assert first.count('class="sl-car"') == 2, "static and continuous, side by side"
    step(at, 4)
    later = html(at)
    assert later != first
    s = session(at)
    static, continuous = (s.runs[s.settings.with_(batching=b)] for b in ("static", "continuous"))
    assert static.step_count == continuous.step_count == 5
    assert len(at.get("vega_lite_chart")) >= 4  # two timelines, two comparisons


def test_static_seats_stay_held_until_the_whole_bus_is_done():
    at = goto(start(), "batching")
    s = session(at)
    static = s.run(s.settings.with_(batching="static"))
    step(at, 15)
    states = [seat["state"] for rep in static.history for seat in rep["seats"]]
    assert "idle-finished" in states
    assert "done, seat held" in html(at) or static.done


def test_paging_page_shows_both_maps_and_a_page_table():
    at = goto(start(), "paging")
    step(at, 3)
    page = html(at)
    assert page.count('class="sl-kv"') == 2, "contiguous and paged maps side by side"
    assert "sl-b reserved" in page, "the contiguous layout reserves blocks ahead"
    assert at.selectbox(key="kv_selected").value
    assert len(at.dataframe) >= 1
    m = [mm.value for mm in at.metric if mm.label == "Held slots holding tokens"]
    assert len(m) == 2 and m[0] != m[1], "useful KV differs between the two layouts"
    before = page
    step(at)
    assert html(at) != before


def test_speculation_page_shows_strips_and_the_acceptance_math():
    at = start()
    at.slider(key="sz_temperature").set_value(1.0).run()
    at = goto(at, "speculation")
    assert any("Speculation is off in the sidebar" in i.value for i in at.info)
    step(at, 8)
    run = session(at).run(session(at).settings.with_(spec="ngram"))
    # the workload is seeded and its prompts repeat themselves: n-gram drafts are verified
    assert any(rep["spec"] for rep in run.history), "no draft verified in 8 steps"
    assert 'class="sl-strip"' in html(at)
    labels = [m.label for m in at.metric]
    assert {"p_target", "p_draft", "min(1, p_target / p_draft)"} <= set(labels)
    assert "Measured speedup" in labels
    # after more steps the page draws the chosen request's strips from the current history
    # (not a stale copy): the legend plus one strip per verification (the last 20)
    from app.components.spec_strip import records_for

    rid = at.selectbox(key="spec_request").value
    step(at, 3)
    shown = html(at).count('class="sl-strip"')
    assert shown == 1 + min(20, len(records_for(run.history, rid)))


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_speculation_page_inspects_what_a_draft_had_to_match(lang):
    """The token inspector: a checked drafted token's alternatives (the target's top 3 from
    the verifier's row, the drafted token outlined) and the row of the target's own token,
    in the page's language; the strips' tooltips name the same alternatives."""
    from app.components.spec_strip import drafted_tokens
    from app.i18n import STRINGS

    at = goto(start(lang), "speculation")
    step(at, 10)
    run = session(at).run(session(at).settings.with_(spec="ngram"))
    rid = at.selectbox(key="spec_request").value
    tokens = drafted_tokens(run.history, rid)
    checked = [i for i, tok in enumerate(tokens) if tok["verdict"] != "discarded"]
    assert checked, "no draft verified in 10 steps of the seeded workload"
    at.selectbox(key=f"spec_token_{rid}").set_value(checked[-1]).run()
    tok = tokens[checked[-1]]
    page = html(at)
    assert page.count('class="sl-alts"') == 2, "the drafted token's row and the target's own"
    assert page.count('class="sl-tok sl-chosen"') == 2
    assert STRINGS["alts.mark.drafted"][lang] in page
    assert STRINGS["alts.mark.emitted"][lang] in page
    captions = " ".join(c.value for c in at.caption)
    assert STRINGS["spec.alts_caption"][lang][:12] in captions
    tip = html_escape(STRINGS["spec.tip.top"][lang].split("{")[0])
    assert tip in page, "the strips' tooltips name the target's alternatives"
    assert len(tok["top"]) == 3


def test_batching_page_inspects_the_samplers_choice():
    """The app's runs ask for 3 alternatives when not speculating: the inspector shows a
    request's latest token, the sampler's choice outlined among the model's top 3."""
    from app.i18n import STRINGS

    at = goto(start(), "batching")
    assert STRINGS["alts.wait"]["en"] in " ".join(c.value for c in at.caption)
    step(at, 4)
    page = html(at)
    assert page.count('class="sl-alts"') == 1 and "← the sampler&#x27;s choice" in page
    rid = at.selectbox(key="alts_request").value
    s = session(at)
    run = s.runs[s.settings.with_(batching=s.settings.batching)]
    em = [e for rep in run.history for e in rep["emitted"] if e["request_id"] == rid]
    assert em and all(len(e["logprobs"][0][1]) == 3 for e in em)
    # greedy (the sidebar's temperature 0): the sampler's choice is the model's top token
    assert all(e["token_ids"][0] == e["logprobs"][0][1][0][0] for e in em)


def test_switching_language_changes_the_text():
    at = goto(start("en"), "batching")
    assert at.title[0].value == "Continuous batching"
    at.radio(key="lang").set_value("zh").run()
    assert not at.exception
    assert at.title[0].value == "连续批处理"
    assert at.button(key="ctl_step").label == "单步"


@pytest.mark.parametrize("prompt,needle", [("   ", "prompt is empty"),
                                           ("word " * 400, "max_model_len"),
                                           ("x" * (MAX_PROMPT_CHARS + 1), "characters")])
def test_a_bad_custom_prompt_shows_the_engines_error_and_the_session_goes_on(prompt, needle):
    at = goto(start(), "dashboard")
    step(at, 2)
    at.text_area(key="custom_prompt").input(prompt)
    at.button(key="custom_add").click().run()
    assert not at.exception
    errors = " ".join(e.value for e in at.error)
    assert needle in errors and "cannot be added" in errors
    step(at, 2)
    assert session(at).primary.step_count == 4


def test_a_good_custom_prompt_joins_every_run_and_escapes_its_text():
    at = goto(start(), "batching")
    step(at)
    at.text_area(key="custom_prompt").input("<script>alert(1)</script>").run()
    at.button(key="custom_add").click().run()
    assert not at.exception
    assert any("Added as request" in s.value for s in at.success)
    s = session(at)
    assert all(len(r.engine.requests) == 13 for r in s.runs.values())
    step(at, 2)
    assert "<script>alert(1)</script>" not in html(at)


def test_a_query_string_sets_the_switches():
    at = AppTest.from_file(MAIN, default_timeout=TIMEOUT)
    at.session_state["lang"] = "en"
    at.query_params["batching"] = "static"
    at.query_params["kv_layout"] = "contiguous"
    at.run()
    assert at.radio(key="sw_batching").value == "static"
    assert at.radio(key="sw_kv_layout").value == "contiguous"
    assert session(at).settings.kv_layout == "contiguous"


def test_reset_and_a_switch_replay_the_workload_from_the_start():
    at = goto(start(), "dashboard")
    step(at, 3)
    at.button(key="ctl_reset").click().run()
    assert session(at).tick == 0 and session(at).primary.step_count == 0
    step(at, 2)
    at.radio(key="sw_batching").set_value("static").run()
    s = session(at)
    assert s.tick == 0 and s.primary.step_count == 0
    assert len(s.primary.engine.requests) == 12


def test_home_race_measures_both_servers(monkeypatch):
    monkeypatch.setattr("app.race.RACE_REQUESTS", 3)
    monkeypatch.setattr("app.race.RACE_MAX_TOKENS", 4)
    at = goto(start(), "home")
    assert any("Not raced yet" in i.value for i in at.info)
    at.button(key="race_start").click().run()
    assert not at.exception, at.exception[0].value
    result = at.session_state["race_result"]
    assert result["requests"] == 3
    assert result["naive"]["tokens"] == result["engine"]["tokens"] > 0
    assert result["ratio"] == pytest.approx(
        result["engine"]["tokens_per_s"] / result["naive"]["tokens_per_s"])
    labels = [m.label for m in at.metric]
    assert {"Naive server", "Engine", "Ratio"} <= set(labels)


def test_adaptive_k_shows_its_choice_and_why():
    """The sidebar's adaptive-k box: the page names this step's k, draws every k's expected
    tokens per second with the chosen one marked, and k over the run, from the StepReports."""
    at = switches(start(), "continuous", "paged", "ngram")
    at.checkbox(key="sw_adaptive").check().run()
    assert session(at).settings.adaptive_k
    at = goto(at, "speculation")
    step(at, 10)
    run = session(at).run(session(at).settings)
    plans = [r["spec_plan"] for r in run.history if r["spec_plan"].get("estimates")]
    assert plans and all(p["adaptive"] for p in plans)
    last = plans[-1]
    words = "Step {}: the engine chose k = {}".format(run.history[-1]["step"], last["k"])
    detour = "a measuring detour at k = {}".format(last["k"])
    captions = " ".join(c.value for c in at.caption)
    assert words in captions or detour in captions, captions
    specs = " ".join(c.proto.spec for c in at.get("vega_lite_chart"))
    assert "Expected tokens/s by k, this step" in specs
    assert "k at each step" in specs


def test_prompt_lookup_first_says_who_drafted():
    """The sidebar's lookup-first box (shown for draft and eagle): on grounded text the
    page counts the drafts prompt lookup made and marks them in the strips; the rest came
    from the draft model."""
    at = switches(start(), "continuous", "paged", "draft")
    at.selectbox(key="sz_workload").set_value("grounded").run()
    at.checkbox(key="sw_lookup").check().run()
    assert session(at).settings.lookup_first
    at = goto(at, "speculation")
    step(at, 12)
    run = session(at).run(session(at).settings)
    recs = [rec for r in run.history for rec in r["spec"]]
    by_lookup = sum(rec["source"] == "lookup" for rec in recs)
    assert recs and {rec["source"] for rec in recs} <= {"lookup", "model"}
    words = f"Prompt lookup first: of {len(recs)} verified drafts, {by_lookup} were copied"
    assert words in " ".join(c.value for c in at.caption)
    assert by_lookup > 0, "grounded prompts copy: lookup should find matches"
    assert "prompt lookup" in html(at)


def test_speculation_measurements_run_from_their_buttons():
    at = goto(start(), "speculation")
    at.button(key="fwd_measure").click().run()
    assert not at.exception, at.exception[0].value
    rows = at.session_state["fwd_rows"]
    assert [r["tokens"] for r in rows] == list(FORWARD_SIZES)
    assert all(r["ms"] > 0 for r in rows)
    at.select_slider(key="lossless_n").set_value(100)
    at.button(key="lossless_run").click().run()
    assert not at.exception, at.exception[0].value
    res = at.session_state["lossless"]
    assert res["n"] == 100 and res["n_off"] > 50
    assert abs(sum(r["p_target"] for r in res["rows"]) - 1) < 1e-4
    assert res["tv_on"] < 0.25 and res["tv_off"] < 0.25, "sampling noise only"
    assert len(at.get("vega_lite_chart")) >= 2


def test_the_request_count_control_sizes_the_workload():
    at = goto(start(), "dashboard")
    at.slider(key="sz_requests").set_value(5).run()
    assert not at.exception, at.exception[0].value
    assert len(session(at).primary.engine.requests) == 5
    assert "5 requests wait at the door" in " ".join(i.value for i in at.info)


def test_dashboard_shows_itl_tokens_per_pass_and_the_speedup_with_speculation():
    at = goto(start(), "dashboard")
    at = switches(at, "continuous", "paged", "ngram")
    step(at, 8)
    m = metrics(at)
    assert m["ITL p50"].endswith("ms") and m["TPOT p50"].endswith("ms")
    run = session(at).primary
    if any(rep["spec"] for rep in run.history):
        assert float(m["Tokens per target pass"]) >= 1
    assert m["Measured speedup"].startswith("×")
    assert len(session(at).runs) == 2, "the same workload without speculation runs alongside"


def test_speculation_page_names_both_acceptance_numbers_and_the_formula():
    at = goto(start(), "speculation")
    step(at, 10)
    m = metrics(at)
    assert {"Acceptance rate", "Per-token acceptance a", "Formula: tokens per target pass",
            "Tokens per target pass"} <= set(m)
    assert any("the formula predicts" in c.value for c in at.caption)
    assert any("Recorded, not measured live" in c.value and "benchmarks.spec_bench" in c.value
               for c in at.caption)


def test_greedy_side_by_side_gives_the_same_text_in_fewer_passes(monkeypatch):
    monkeypatch.setattr("app.spec_lab.SIDE_BY_SIDE_REQUESTS", 2)
    monkeypatch.setattr("app.spec_lab.SIDE_BY_SIDE_TOKENS", 12)
    at = goto(start(), "speculation")
    at.button(key="sbs_run").click().run()
    assert not at.exception, at.exception[0].value
    res = at.session_state["side_by_side"]
    assert len(res["rows"]) == 2 and all(r["identical"] for r in res["rows"])
    assert res["passes_on"] <= res["passes_off"] == res["tokens"]


def test_byte_tokens_of_a_chinese_character_join_to_it():
    from app.components.spec_strip import token_bytes

    tok = session(start()).primary.engine.tokenizer
    ids = tok.encode("猫是一种动物", add_special_tokens=False)
    by_id = token_bytes(tok, ids)
    assert b"".join(by_id[i] for i in ids).decode() == "猫是一种动物"


def test_each_class_plan_button_sets_exactly_the_knobs_of_its_stop():
    from app.classplan import STOPS
    from app.sidebar import WIDGET_FOR

    at = start()
    for stop in STOPS:
        at = goto(at, "plan")
        assert not at.exception, at.exception[0].value
        at.button(key=f"plan_{stop.id}").click().run()
        assert not at.exception, at.exception[0].value
        assert session(at).settings == stop.settings, stop.id
        assert session(at).tick == 0, "the stop starts its workload afresh"
        for name, value in stop.knobs.items():  # the sidebar shows them too
            if name == "k" and stop.knobs["spec"] == "off":
                continue  # the k slider is drawn only with speculation on
            assert at.session_state[WIDGET_FOR[name]] == value, (stop.id, name)
        assert at.session_state["class_stop"] == stop.id


def test_a_prediction_is_locked_before_the_run_and_revealed_after_it():
    at = goto(start(), "plan")
    at.button(key="plan_draft").click().run()
    at.slider(key="sz_requests").set_value(2).run()  # a shorter run of the same stop
    at = goto(at, "speculation")
    assert any("Predict first" in m.value for m in at.markdown)
    at.radio(key="pred_draft_choice").set_value(1)
    at.button(key="pred_draft_lock").click().run()
    assert at.session_state["class_predictions"] == {"draft": 1}
    assert any("Press Play to run every request" in c.value for c in at.caption)
    for _ in range(200):  # both runs (speculation on and off) to the end
        if all(r.done for r in session(at).runs.values()):
            break
        at.button(key="ctl_step").click().run()
    step(at, 1)
    assert all(r.done for r in session(at).runs.values())
    shown = " ".join(b.value for b in [*at.success, *at.warning])
    assert "Measured:" in shown
    value, index = at.session_state["class_reveals"]["draft"]
    assert value >= 1 and index in (0, 1, 2)
    assert ("Your prediction was right" in shown) == (index == 1)
    at = goto(at, "plan")
    assert any("This class predicted" in c.value for c in at.caption)


def test_a_long_stop_plays_several_steps_a_tick_and_shows_how_far_it_is():
    """Stop 4's run is 266 steps: Play advances it 3 a tick (its minute on the projector),
    and after the lock its progress says the step, the run's length and the time left."""
    from app.classplan import stop_by_id
    from app.live import _play_tick

    hall = stop_by_id("hall")
    at = goto(start(), "plan")
    at.button(key="plan_hall").click().run()
    at = goto(at, "paging")
    assert session(at).stride == hall.stride == 3
    at.radio(key="pred_hall_choice").set_value(1)
    at.button(key="pred_hall_lock").click().run()
    step(at, 1)
    progress = [p.text for p in at.get("progress")]
    assert any("Step 1 of 266 (Play advances 3 a tick)" in p for p in progress), progress
    s = session(at)
    s.last_play_s = 0.0
    _play_tick(s, 0.5)
    assert s.tick == 4  # a tick of Play: three steps


def test_a_finished_paging_run_shows_its_fullest_moment():
    """Done, the paging page draws each map at the step it held the most requests (the last
    step's map is empty), and says which step that is."""
    from app.pages.paging import fullest

    at = goto(start(), "paging")
    at.slider(key="sz_requests").set_value(3).run()
    for _ in range(300):
        if all(r.done for r in session(at).runs.values()):
            break
        at.button(key="ctl_step").click().run()
    assert all(r.done for r in session(at).runs.values())
    for run in session(at).runs.values():
        peak = fullest(run)
        most = max(len(r["kv"]["block_tables"]) for r in run.history)
        assert len(peak["kv"]["block_tables"]) == most > 0 == len(run.last["kv"]["block_tables"])
        assert peak["step"] == min(r["step"] for r in run.history
                                   if len(r["kv"]["block_tables"]) == most)
    shown = [c.value for c in at.caption if "fullest moment" in c.value]
    assert len(shown) == 2, shown  # one a layout


def test_the_race_stop_clears_an_earlier_race_and_names_its_button():
    """The race's answer must not be on screen before the class predicts: setting up the stop
    drops a race run earlier; its caption names the button the page shows."""
    at = goto(start(), "plan")
    at.session_state["race_result"] = {"ratio": 9.99}
    at.button(key="plan_race").click().run()
    assert not at.exception, at.exception[0].value
    assert "race_result" not in at.session_state
    assert any('then press "Start the race"' in c.value for c in at.caption)
    assert any(b.label == "Start the race" for b in at.button)
    assert not any("9.99" in m.value for m in at.metric)


def test_the_plan_shows_each_stops_chapter_range_and_its_slack():
    at = goto(start(), "plan")
    text = " ".join(c.value for c in at.caption)
    assert "The chapter's range: ≥ ×1.50" in text  # the hall stop: paged holds clearly more
    assert "minutes of slack" in text
    at = goto(start("zh"), "plan")
    assert "章节预期的范围" in " ".join(c.value for c in at.caption)


def test_a_class_plan_button_keeps_the_language():
    at = goto(start("zh"), "plan")
    at.button(key="plan_bus").click().run()
    assert not at.exception, at.exception[0].value
    assert at.session_state["lang"] == "zh"
    assert any("先预测" in m.value for m in at.markdown), "the stop's page speaks Chinese"


def test_the_apprentice_is_offered_once_trained_and_its_command_shown_until_then(
        monkeypatch, tmp_path):
    """Until `python -m engine.spec.train_draft` has written the EAGLE head, the sidebar does
    not offer it and both the sidebar and the speculation page say how to build it; once the
    file exists, the switch offers it and the page describes it."""
    import torch

    from engine.config import EngineConfig
    from engine.model.llama import LlamaModel
    from engine.model.loader import load_model
    from engine.plan import plan_for
    from engine.spec import eagle

    head = tmp_path / "eagle-smollm2-135m.safetensors"
    monkeypatch.setattr(eagle, "head_path", lambda model_name="smollm2-135m": head)
    at = goto(start(), "speculation")
    assert not at.exception, at.exception[0].value
    (radio,) = [r for r in at.radio if r.key == "sw_spec"]
    assert "eagle" not in radio.options and "EAGLE apprentice" not in radio.options
    # the sidebar trains it from a button, no terminal (app/apprentice.py)
    assert any(b.key == "apprentice_train" and b.label == "Train the apprentice"
               for b in at.sidebar.button)
    assert any("The button below trains it" in c.value for c in at.sidebar.caption)
    assert any("python -m engine.spec.train_draft" in i.value for i in at.info)

    target = LlamaModel(load_model("smollm2-135m", torch.float32), plan_for(EngineConfig(
        device="cpu", dtype="float32", weights="dense", cpu_kernels=False)), 64)
    eagle.save_weights(eagle.init_weights(target, torch.arange(256)), head,
                       {"held_out_agreement": 0.5, "wall_s": 600, "cpu_s": 500})
    at = goto(start(), "speculation")
    assert not at.exception, at.exception[0].value
    (radio,) = [r for r in at.radio if r.key == "sw_spec"]
    assert "EAGLE apprentice" in radio.options or "eagle" in radio.options
    assert any("EAGLE apprentice:" in c.value and "256-token readout" in c.value
               for c in at.caption)
    assert not any("python -m engine.spec.train_draft" in i.value for i in at.info)
    assert not any(b.key == "apprentice_train" for b in at.sidebar.button)
    # the int4 twin's cost on a GPU is said, not hidden (there is no int4 kernel on CUDA)
    assert any("On a GPU (CUDA) the int4 twin is not cheaper" in c.value for c in at.caption)
    # with the apprentice on, its confidence stop is a slider that reaches the engine's config
    assert not any(sl.key == "sw_confidence" for sl in at.sidebar.slider)
    at.radio(key="sw_spec").set_value("eagle").run()
    assert at.sidebar.slider(key="sw_confidence").value == 0.5
    at.sidebar.slider(key="sw_confidence").set_value(0.8).run()
    assert not at.exception, at.exception[0].value
    cfg = session(at).settings.engine_config(256).spec
    assert (cfg.method, cfg.min_confidence) == ("eagle", 0.8)


def test_the_speedup_bound_follows_its_sliders_and_the_recorded_costs():
    """Under the forward-cost chart: the lesson's formula over the recorded costs, for the a
    and c the sliders set, equal to benchmarks.spec_bench.speedup_bound; the apprentice table
    lists the head's variants the bench ran; the speedup chart draws the methods picked."""
    from app.spec_lab import load_bench
    from benchmarks.spec_bench import GOALS, needed_acceptance, speedup_bound

    bench = load_bench()
    assert bench, "no spec bench file under assets/bench/ (the page reads the committed one)"
    at = goto(start(), "speculation")
    at.slider(key="bound_a").set_value(0.75).run()
    at.slider(key="bound_c").set_value(0.1).run()
    assert not at.exception, at.exception[0].value
    best = speedup_bound(bench["forward_cost"], 0.1, a=0.75)
    perfect = speedup_bound(bench["forward_cost"], 0.1)
    words = (f"a draft with a = 0.75 and c = 0.10 gives at most {best['speedup']:.2f}x "
             f"(k = {best['k']}); even a draft accepted every time gives at most "
             f"{perfect['speedup']:.2f}x")
    assert any(words in c.value for c in at.caption), [c.value for c in at.caption]
    need = [needed_acceptance(bench["forward_cost"], 0.1, g) for g in GOALS]
    words = "a draft with c = 0.10 needs a ≥ " + f" for {GOALS[0]:g}x and a ≥ ".join(
        f"{a:.2f}" if a is not None else "(no a is enough)" for a in need) + f" for {GOALS[1]:g}x"
    assert any(words in c.value for c in at.caption), [c.value for c in at.caption]
    methods = {r["spec"] for r in bench["results"] if r.get("spec")}
    table = " ".join(str(df.value) for df in at.dataframe)
    if "eagle+lookup+adaptive" in methods:
        assert "lookup first" in table
    (pick,) = [m for m in at.multiselect if m.key == "speedup_methods"]
    pick.set_value(["ngram"]).run()
    assert not at.exception, at.exception[0].value
    (chart,) = [c for c in at.get("vega_lite_chart")
                if "Speedup vs concurrent requests" in c.proto.spec]
    import pyarrow as pa

    drawn = {m for d in chart.proto.datasets
             for m in pa.ipc.open_stream(d.data.data).read_all().to_pydict().get("method", [])}
    assert drawn == {"ngram · grounded", "ngram · open"}, drawn


def test_the_class_page_offers_the_spec_refinements(app):
    """Before the class starts: the spec switch's k and two boxes appear under speculation
    (prompt lookup only for a draft model), as in the sidebar."""
    at = goto(app, "classroom")
    keys = {c.key for c in at.checkbox}
    assert "cls_new_adaptive_k" not in keys and "cls_new_lookup_first" not in keys
    assert "cls_new_k" not in {s.key for s in at.slider}
    at.radio(key="cls_new_spec").set_value("ngram").run()
    keys = {c.key for c in at.checkbox}
    assert "cls_new_adaptive_k" in keys and "cls_new_lookup_first" not in keys
    assert at.slider(key="cls_new_k").value == 4
    at.radio(key="cls_new_spec").set_value("draft").run()
    assert not at.exception, at.exception[0].value
    assert {"cls_new_adaptive_k", "cls_new_lookup_first"} <= {c.key for c in at.checkbox}


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_the_beyond_page_draws_its_four_pictures(lang):
    """Acceptance rule, GPU roofline, one request's timeline, one request's blocks: each
    drawn, each labelled by its source; dragging the draft onto the target accepts all."""
    from app.i18n import STRINGS

    at = goto(start(lang), "beyond")
    assert not at.exception, at.exception[0].value
    heads = [h.value for h in at.subheader]
    for key in ("beyond.acc.header", "beyond.roof.header", "beyond.tl.header",
                "beyond.blk.header"):
        assert STRINGS[key][lang] in heads, (key, heads)
    assert len(at.get("vega_lite_chart")) >= 6  # 2 acceptance, 2 roofline, timeline, blocks
    assert len(at.table) == 1  # the timeline's TTFT, TPOT and ITL, both runs
    labels = {m.label: m.value for m in at.metric}
    computed = STRINGS["beyond.acc.computed"][lang]
    assert ("计算所得" if lang == "zh" else "computed") in computed
    assert 0.0 < float(labels[computed]) < 1.0
    assert not at.error and not at.warning and not at.info
    at.select_slider(key="beyond_temp").set_value(1.0).run()
    assert not at.exception, at.exception[0].value
    labels = {m.label: m.value for m in at.metric}
    assert float(labels[computed]) == 1.0
    measured = [v for k, v in labels.items() if k == STRINGS["beyond.acc.measured"][lang]]
    assert measured == ["1.000"]


def test_paging_page_draws_parallel_samples_sharing_then_copying_their_blocks():
    """n = 2 from the sidebar: the paged engine forks each prompt's samples, the map and the
    fork lines show their shared prompt blocks (reference count 2), and the first write into
    the shared partial block copies it (copy-on-write), as the PagedAttention paper draws."""
    at = start()
    at.slider(key="sz_requests").set_value(2)
    at.slider(key="sz_samples").set_value(2)
    at.slider(key="sz_temperature").set_value(0.8)
    goto(at.run(), "paging")
    step(at, 3)
    paged = session(at).runs[session(at).settings]
    assert paged.settings.samples == 2 and paged.settings.kv_layout == "paged"
    kv = paged.last["kv"]
    assert {"r0#0", "r0#1", "r1#0", "r1#1"} <= set(kv["block_tables"])
    shared = [b for b in kv["blocks"] if len(b["owners"]) == 2]
    assert shared and all(b["owners"][0].split("#")[0] == b["owners"][1].split("#")[0]
                          for b in shared), "a prompt's blocks shared by its own samples"
    assert any(rep["kv"]["copies"] for rep in paged.history), "no copy-on-write was drawn"
    lines = "\n".join(m.value for m in at.markdown)
    assert "r0" in lines and "r0#0, r0#1" in lines, lines[-800:]
    assert paged.names["r0#1"].endswith("#1")


def test_a_discarded_drafted_token_shows_no_acceptance_numbers():
    """A drafted token after a rejection was never examined: the token math shows dashes and
    says why, not a p_target and an acceptance chance nobody computed."""
    from app.components.spec_strip import drafted_tokens, spec_requests
    from app.i18n import STRINGS

    at = goto(start(), "speculation")
    step(at, 12)
    run = session(at).run(session(at).settings.with_(spec="ngram"))
    for rid in spec_requests(run.history):
        tokens = drafted_tokens(run.history, rid)
        gone = [i for i, tok in enumerate(tokens) if tok["verdict"] == "discarded"]
        if gone:
            break
    else:
        raise AssertionError("no drafted token was discarded in 12 steps of the seeded workload")
    at.selectbox(key="spec_request").set_value(rid).run()
    at.selectbox(key=f"spec_token_{rid}").set_value(gone[0]).run()
    values = {m.label: m.value for m in at.metric}
    assert values["p_target"] == values["p_draft"] == "—"
    assert values["min(1, p_target / p_draft)"] == "—"
    assert STRINGS["spec.discarded_note"]["en"] in " ".join(c.value for c in at.caption)
