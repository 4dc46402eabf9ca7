"""`python -m trainer eval`: command.py (the command), loss.py (loss and perplexity with the training masks),
references.py (questions and reference answers of the eval set), metrics.py (exact_match, contains, regex)."""
