"""Model registry, Hugging Face cache resolution and loading (torch is imported lazily)."""
