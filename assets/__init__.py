"""The app's files that are not code: its icon, the recorded benchmarks (bench/), the bundled
recordings (recordings/) and the recorded next-token distribution (beyond/). A package only
so that a wheel carries them beside the app (pyproject's package-data); nothing imports it.
The README's screenshots (screenshots/) stay out of the wheel."""
