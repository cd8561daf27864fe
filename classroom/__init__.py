"""The class: ServeLab's lab for a class on phones, beside the engine (`engine/`) and the
teacher's app (`app/`): the students' page and routes (`server.py`, `vote_panel.py`), the
votes (`votes.py`, `vote_routes.py`) and the gains (`gains.py`).
"""
