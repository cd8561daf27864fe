"""What the app teaches, as data (README.md here says what each file holds). A package only so
that its files travel with an installed wheel: read them with importlib.resources
(`files("lessons")`), never by a path relative to a checkout. One module of code:
figures.py, the reader of figures.json that fills `{{figure:NAME}}` in any text (the app's
pages and the classroom's rounds both use it)."""
