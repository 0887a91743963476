"""The decode engine (scheduling, isolation, micro-batching) and its batch decoders, one module
each (`cpu_batch`, `nvjpeg`, `nvdec`, `dali`); `protocol` is the contract between them and the
handles they decode."""
from .availability import BackendStatus, backends
from .engine import DecodeEngine, default_engine
from .protocol import BatchDecoder, DecodeItem, Fallback, Route

__all__ = ["BackendStatus", "BatchDecoder", "DecodeEngine", "DecodeItem", "Fallback", "Route", "backends",
           "default_engine"]
