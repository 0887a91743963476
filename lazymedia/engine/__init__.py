"""Decode backends (one module each) and the engine that schedules them."""
from .backends import Backend, backends
from .engine import DecodeEngine, default_engine

__all__ = ["Backend", "DecodeEngine", "backends", "default_engine"]
