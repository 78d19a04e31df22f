"""The question-answering demo: a web page, a JSON API and an OpenAI-compatible endpoint over the RAG pipelines.

Start it with ``rag-mag serve`` (see ``rag_mag/cli/serve.py``); ``create_app(service)`` builds the FastAPI app
around a ``DemoService`` (``rag_mag.demo.service``) whose indexes ``rag_mag.demo.loading.load_index`` loaded.
"""
