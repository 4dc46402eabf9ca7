"""`python -m trainer bench`: command.py (CLI), session.py (the rows in order), catalogue.py (every row there is),
runner.py (one row as a subprocess), report.py (tables, CSV, chart), machine.py (what the report says about the host).
"""
