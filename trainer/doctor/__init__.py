"""`python -m trainer doctor`: command.py (the report), rows.py (the probes)."""
