"""`python -m trainer generate`: command.py (the command), loading.py (MODEL -> model + tokenizer, also for
`eval`), decoding.py (templates, decoding settings, batched generation), batch.py (prompt files in, answers out)."""
