"""Terminal UI: the live view of denoising (stderr, TTY only)."""
