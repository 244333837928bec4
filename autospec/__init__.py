"""autospec: benchmark and autotune speculative decoding for LLM serving."""

__version__ = "0.1.0"
