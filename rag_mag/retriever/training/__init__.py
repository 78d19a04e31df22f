"""Training a retriever: the config, the loop and its batches, checkpoints, validation, selection and recipes."""
