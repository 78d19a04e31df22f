"""The vLLM server that generates: its settings, the readers it serves, its pid files, start and stop, pre-flight."""
