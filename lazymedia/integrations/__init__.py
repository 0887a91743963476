"""Adapters that let a serving stack use lazymedia in place of its own media layer. The modules
are private (`_vllm`: vLLM's `MediaConnector` surface; `_vllm_device`: the plugin's GPU mode)
except `vllm_plugin`, vLLM's entry point; these names are the public face. They import torch, so
they import on first use: importing this package loads nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._exports import lazy_exports

if TYPE_CHECKING:  # what type checkers see of the names below, which run time imports on first use
    from ._vllm import (
        LAZYMEDIA_SETTINGS,
        VLLM_MEDIA_SETTINGS,
        ConnectorClosedError,
        DataUrlEncodingError,
        LocalFilesRefusedError,
        VllmAudioFileTooLargeError,
        VllmDownloadTooLargeError,
        VllmMediaConnector,
        VllmMediaFetchError,
        VllmUnprocessableMediaError,
        to_vllm,
    )
    from ._vllm_device import DeviceImage, DeviceMode

_VLLM = (
    "LAZYMEDIA_SETTINGS",
    "VLLM_MEDIA_SETTINGS",
    "ConnectorClosedError",
    "DataUrlEncodingError",
    "LocalFilesRefusedError",
    "VllmAudioFileTooLargeError",
    "VllmDownloadTooLargeError",
    "VllmMediaConnector",
    "VllmMediaFetchError",
    "VllmUnprocessableMediaError",
    "to_vllm",
)
_LAZY = {
    **dict.fromkeys(_VLLM, "lazymedia.integrations._vllm"),
    "DeviceImage": "lazymedia.integrations._vllm_device",
    "DeviceMode": "lazymedia.integrations._vllm_device",
}


__getattr__ = lazy_exports(__name__, _LAZY)


__all__ = [
    "LAZYMEDIA_SETTINGS",
    "VLLM_MEDIA_SETTINGS",
    "ConnectorClosedError",
    "DataUrlEncodingError",
    "DeviceImage",
    "DeviceMode",
    "LocalFilesRefusedError",
    "VllmAudioFileTooLargeError",
    "VllmDownloadTooLargeError",
    "VllmMediaConnector",
    "VllmMediaFetchError",
    "VllmUnprocessableMediaError",
    "to_vllm",
]
