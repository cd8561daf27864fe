"""The students' page, as the static files under `classroom/static/` (importlib.resources).

One page, no framework, no external resource (a classroom may be offline):

- `student.html`: the answer panel (join code, nickname, question, the answer and its
  journey) and its style. Every string it shows is in `STR` (`student.js`) in both
  languages; it starts in the phone's language (navigator.language, the same as
  Accept-Language) and the button in its corner switches. It keeps a random secret and the
  id of its last answer in localStorage, so a reload reattaches to the answer (running or
  finished) instead of losing it. After the answer it draws the request's own timeline
  (the `done` event's stretches: a bar each on a 1-2-5 ms axis, its steps, its reasons),
  and a 429 for the phone's own limit as a wait of its own, with a countdown. Bars are
  placed through the CSSOM (`el.style`), which the CSP allows; no style attribute.
- `student.js`: the answer panel's script, put inside the page's one `<script>` tag.
- `vote_panel.html`: the vote panel, one self-contained HTML/CSS/JS block put before
  `</body>`, so the panel and the answer panel stay separate. It joins the class once (`POST
  /class/join`; the phone id it gets is kept in localStorage, so a reload keeps it), polls
  `GET /class/vote` and shows the open round's question and choices in the phone's language
  (Accept-Language, or the panel's own toggle), marks the phone's own choice and lets it
  change until the round locks; when the teacher opens the pre- or post-test it shows this
  phone's form. It reads only this phone's own view (the server sends nothing else).

Every string that came from a person, the model or the server is written with textContent,
never innerHTML. Each `<script>` and `<style>` carries `nonce="{{NONCE}}"`, which the route
replaces with a nonce made for each response (its Content-Security-Policy allows only those).
"""

from __future__ import annotations

from importlib.resources import files


def static(name: str) -> str:
    """A file of `classroom/static/`, read from the installed package."""
    return files("classroom").joinpath("static").joinpath(name).read_text(encoding="utf-8")


def student_page() -> str:
    """The page as served, with `{{NONCE}}` still to be replaced."""
    html = static("student.html").replace("{{student.js}}", static("student.js"))
    return html.replace("</body>", "\n" + static("vote_panel.html") + "</body>")


PAGE = student_page()
