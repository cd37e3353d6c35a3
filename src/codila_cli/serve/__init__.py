"""`codila serve`: the engine over HTTP (docs/serve.md). Imports FastAPI; the CLI imports it lazily."""
