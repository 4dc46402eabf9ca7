"""`python -m trainer doctor`: command.py (the report), probes.py (one probe of this machine per line)."""
