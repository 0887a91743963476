"""Decode backends (one module each) and the engine that schedules them."""
from .engine import DecodeEngine, default_engine

__all__ = ["DecodeEngine", "default_engine"]
