"""Training of codila's bundled models: corpus, tokenizer, DLM, AR helper, infill and plan stages."""
