// libnvjpeg, loaded with dlopen at first use: the extension links no GPU library, so it imports
// (and the CPU paths run) on machines without nvJPEG. Only the entry points lazymedia calls.
#pragma once

#include <nvjpeg.h>

#include <string>

namespace lazymedia {
namespace cuda {

struct NvjpegApi {
  decltype(&nvjpegCreateExV2) CreateExV2;
  decltype(&nvjpegCreateEx) CreateEx;
  decltype(&nvjpegDestroy) Destroy;
  decltype(&nvjpegGetHardwareDecoderInfo) GetHardwareDecoderInfo;
  decltype(&nvjpegJpegStateCreate) JpegStateCreate;
  decltype(&nvjpegJpegStateDestroy) JpegStateDestroy;
  decltype(&nvjpegDecodeBatchedInitialize) DecodeBatchedInitialize;
  decltype(&nvjpegDecodeBatched) DecodeBatched;
  decltype(&nvjpegDecodeBatchedSupported) DecodeBatchedSupported;
  decltype(&nvjpegJpegStreamCreate) JpegStreamCreate;
  decltype(&nvjpegJpegStreamDestroy) JpegStreamDestroy;
  decltype(&nvjpegJpegStreamParse) JpegStreamParse;
  decltype(&nvjpegJpegStreamParseHeader) JpegStreamParseHeader;
  decltype(&nvjpegJpegStreamGetFrameDimensions) JpegStreamGetFrameDimensions;
  decltype(&nvjpegJpegStreamGetComponentsNum) JpegStreamGetComponentsNum;
  decltype(&nvjpegJpegStreamGetJpegEncoding) JpegStreamGetJpegEncoding;
  decltype(&nvjpegDecoderJpegSupported) DecoderJpegSupported;
  decltype(&nvjpegDecoderCreate) DecoderCreate;
  decltype(&nvjpegDecoderDestroy) DecoderDestroy;
  decltype(&nvjpegDecoderStateCreate) DecoderStateCreate;
  decltype(&nvjpegBufferPinnedCreateV2) BufferPinnedCreateV2;
  decltype(&nvjpegBufferPinnedDestroy) BufferPinnedDestroy;
  decltype(&nvjpegBufferDeviceCreateV2) BufferDeviceCreateV2;
  decltype(&nvjpegBufferDeviceDestroy) BufferDeviceDestroy;
  decltype(&nvjpegStateAttachPinnedBuffer) StateAttachPinnedBuffer;
  decltype(&nvjpegStateAttachDeviceBuffer) StateAttachDeviceBuffer;
  decltype(&nvjpegDecodeParamsCreate) DecodeParamsCreate;
  decltype(&nvjpegDecodeParamsDestroy) DecodeParamsDestroy;
  decltype(&nvjpegDecodeParamsSetOutputFormat) DecodeParamsSetOutputFormat;
  decltype(&nvjpegDecodeJpegHost) DecodeJpegHost;
  decltype(&nvjpegDecodeJpegTransferToDevice) DecodeJpegTransferToDevice;
  decltype(&nvjpegDecodeJpegDevice) DecodeJpegDevice;
  decltype(&nvjpegGetProperty) GetProperty;
  decltype(&nvjpegGetCudartProperty) GetCudartProperty;
  // Optional (nullptr where the library lacks it): reserves the hardware batch's buffers up front.
  decltype(&nvjpegDecodeBatchedPreAllocate) DecodeBatchedPreAllocate;
};

// The loaded API, or nullptr with `error` set. `library_path` (may be empty) is tried before the
// sonames libnvjpeg.so.13 and libnvjpeg.so.12; the first successful load is kept for the process.
const NvjpegApi* load_nvjpeg(const std::string& library_path, std::string* error);

const char* nvjpeg_status_name(nvjpegStatus_t status);

}  // namespace cuda
}  // namespace lazymedia
