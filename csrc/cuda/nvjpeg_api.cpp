#include "nvjpeg_api.h"

#include <dlfcn.h>

#include <mutex>

namespace lazymedia {
namespace cuda {
namespace {

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(dlsym(lib, name));
  if (!*out) *missing = name;
  return *out != nullptr;
}

bool bind_all(void* lib, NvjpegApi* api, std::string* missing) {
  return bind(lib, "nvjpegCreateExV2", &api->CreateExV2, missing) &&
         bind(lib, "nvjpegCreateEx", &api->CreateEx, missing) && bind(lib, "nvjpegDestroy", &api->Destroy, missing) &&
         bind(lib, "nvjpegGetHardwareDecoderInfo", &api->GetHardwareDecoderInfo, missing) &&
         bind(lib, "nvjpegJpegStateCreate", &api->JpegStateCreate, missing) &&
         bind(lib, "nvjpegJpegStateDestroy", &api->JpegStateDestroy, missing) &&
         bind(lib, "nvjpegDecodeBatchedInitialize", &api->DecodeBatchedInitialize, missing) &&
         bind(lib, "nvjpegDecodeBatched", &api->DecodeBatched, missing) &&
         bind(lib, "nvjpegDecodeBatchedSupported", &api->DecodeBatchedSupported, missing) &&
         bind(lib, "nvjpegJpegStreamCreate", &api->JpegStreamCreate, missing) &&
         bind(lib, "nvjpegJpegStreamDestroy", &api->JpegStreamDestroy, missing) &&
         bind(lib, "nvjpegJpegStreamParse", &api->JpegStreamParse, missing) &&
         bind(lib, "nvjpegJpegStreamParseHeader", &api->JpegStreamParseHeader, missing) &&
         bind(lib, "nvjpegJpegStreamGetFrameDimensions", &api->JpegStreamGetFrameDimensions, missing) &&
         bind(lib, "nvjpegJpegStreamGetComponentsNum", &api->JpegStreamGetComponentsNum, missing) &&
         bind(lib, "nvjpegJpegStreamGetJpegEncoding", &api->JpegStreamGetJpegEncoding, missing) &&
         bind(lib, "nvjpegDecoderJpegSupported", &api->DecoderJpegSupported, missing) &&
         bind(lib, "nvjpegDecoderCreate", &api->DecoderCreate, missing) &&
         bind(lib, "nvjpegDecoderDestroy", &api->DecoderDestroy, missing) &&
         bind(lib, "nvjpegDecoderStateCreate", &api->DecoderStateCreate, missing) &&
         bind(lib, "nvjpegBufferPinnedCreateV2", &api->BufferPinnedCreateV2, missing) &&
         bind(lib, "nvjpegBufferPinnedDestroy", &api->BufferPinnedDestroy, missing) &&
         bind(lib, "nvjpegBufferDeviceCreateV2", &api->BufferDeviceCreateV2, missing) &&
         bind(lib, "nvjpegBufferDeviceDestroy", &api->BufferDeviceDestroy, missing) &&
         bind(lib, "nvjpegStateAttachPinnedBuffer", &api->StateAttachPinnedBuffer, missing) &&
         bind(lib, "nvjpegStateAttachDeviceBuffer", &api->StateAttachDeviceBuffer, missing) &&
         bind(lib, "nvjpegDecodeParamsCreate", &api->DecodeParamsCreate, missing) &&
         bind(lib, "nvjpegDecodeParamsDestroy", &api->DecodeParamsDestroy, missing) &&
         bind(lib, "nvjpegDecodeParamsSetOutputFormat", &api->DecodeParamsSetOutputFormat, missing) &&
         bind(lib, "nvjpegDecodeJpegHost", &api->DecodeJpegHost, missing) &&
         bind(lib, "nvjpegDecodeJpegTransferToDevice", &api->DecodeJpegTransferToDevice, missing) &&
         bind(lib, "nvjpegDecodeJpegDevice", &api->DecodeJpegDevice, missing) &&
         bind(lib, "nvjpegGetProperty", &api->GetProperty, missing) &&
         bind(lib, "nvjpegGetCudartProperty", &api->GetCudartProperty, missing);
}

// Entry points a decoder works without.
void bind_optional(void* lib, NvjpegApi* api) {
  api->DecodeBatchedPreAllocate =
      reinterpret_cast<decltype(api->DecodeBatchedPreAllocate)>(dlsym(lib, "nvjpegDecodeBatchedPreAllocate"));
}

}  // namespace

const NvjpegApi* load_nvjpeg(const std::string& library_path, std::string* error) {
  static std::mutex mutex;
  static NvjpegApi api;
  static bool loaded = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded) return &api;
  std::string tried;
  for (const std::string& name : {library_path, std::string("libnvjpeg.so.13"), std::string("libnvjpeg.so.12")}) {
    if (name.empty()) continue;
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
      const char* why = dlerror();
      tried += (tried.empty() ? "" : "; ") + (why ? std::string(why) : name);
      continue;
    }
    std::string missing;
    if (!bind_all(lib, &api, &missing)) {
      tried += "; " + name + " lacks " + missing;
      dlclose(lib);
      continue;
    }
    bind_optional(lib, &api);
    loaded = true;
    return &api;
  }
  if (error) *error = "cannot load libnvjpeg: " + tried;
  return nullptr;
}

const char* nvjpeg_status_name(nvjpegStatus_t status) {
  switch (status) {
    case NVJPEG_STATUS_SUCCESS: return "success";
    case NVJPEG_STATUS_NOT_INITIALIZED: return "not initialized";
    case NVJPEG_STATUS_INVALID_PARAMETER: return "invalid parameter";
    case NVJPEG_STATUS_BAD_JPEG: return "bad JPEG";
    case NVJPEG_STATUS_JPEG_NOT_SUPPORTED: return "JPEG not supported";
    case NVJPEG_STATUS_ALLOCATOR_FAILURE: return "allocator failure";
    case NVJPEG_STATUS_EXECUTION_FAILED: return "execution failed";
    case NVJPEG_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case NVJPEG_STATUS_INTERNAL_ERROR: return "internal error";
    case NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED: return "implementation not supported";
    case NVJPEG_STATUS_INCOMPLETE_BITSTREAM: return "incomplete bitstream";
    default: return "unknown nvJPEG status";
  }
}

}  // namespace cuda
}  // namespace lazymedia
