"""The reader: supervised fine-tuning of the packaged SmolLM2 to answer with a short span from its passages."""
