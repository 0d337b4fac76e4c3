"""The HTTP gateway: FastAPI on uvicorn, stateless; run as many as you like."""
