"""The HTTP server (FastAPI): routes over services, the orchestrator loop."""
