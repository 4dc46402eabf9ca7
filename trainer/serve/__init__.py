"""`python -m trainer serve OUT`: an export behind a kept OpenAI-compatible server (command.py)."""
