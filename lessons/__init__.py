"""What the app teaches, as data (README.md here says what each file holds). A package only so
that its files travel with an installed wheel: read them with importlib.resources
(`files("lessons")`), never by a path relative to a checkout. No code here."""
