"""ServeLab's shell: `streamlit run app/main.py`.

`st.navigation` with a section per part of the chapter (built from the page table in
app/pagelist.py by app/nav.py), then the shared sidebar (language, the three switches, sizes,
Step / Play / Reset, the teacher's own prompt, the device line; app/shell.py), the model
loaded once per server process with a progress bar on the first start, and one `Session` (app/state.py) per browser session. Pages draw; they never reach
into the engine.
"""

import os
import pathlib
import sys

# Idle OpenMP threads sleep instead of spinning: the app shares its cores with the web server
# and the browser, and spinning threads fight them for the cores (app/bench_step.py shows a
# Step many times slower with torch's default on a busy 2-core machine; docs/performance.md).
# Must be set before torch loads; a value in the environment wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import streamlit as st  # noqa: E402

from app.nav import pages, shell_drawn  # noqa: E402
from app.pagelist import OWN_ENGINE_PAGES  # noqa: E402
from app.shell import own_engine_shell, shell  # noqa: E402

# A local icon: a material-icon favicon would be fetched from fonts.gstatic.com, and a
# classroom may be offline.
ICON = pathlib.Path(__file__).resolve().parents[1] / "assets" / "icon.png"
st.set_page_config(page_title="ServeLab", page_icon=str(ICON), layout="wide")


def main() -> None:
    nav = st.navigation(pages())
    with shell_drawn():
        if nav.url_path in OWN_ENGINE_PAGES:
            own_engine_shell()
        else:
            shell()
        nav.run()


main()
