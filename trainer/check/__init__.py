"""`python -m trainer check URL --against OUT`: an endpoint held to the export it serves (command.py)."""
