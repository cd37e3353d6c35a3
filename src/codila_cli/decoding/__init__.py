"""Decoders: one loop per algorithm. They never print; they call ``on_step`` with StepEvents."""
