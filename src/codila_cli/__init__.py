"""codila: code generation with diffusion language models and CoDiLA local autoregression."""

__version__ = "0.1.0"
