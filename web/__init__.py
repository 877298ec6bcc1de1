"""HTTP surface: FastAPI routers over the engine and storage."""
