"""Serving: the YAML pipelines (load, override, pre-flight, run) and the vLLM server that generates."""
