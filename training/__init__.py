"""Training of the shipped default model (models/gapless-tiny-python/).

Owns the corpus, tokenizer and training loop that produce the demo model. It is a build tool,
never imported by engine/, telemetry/ or ui/: the engine only loads the folder it writes.
"""
