// The CUDA runtime calls the nvJPEG decoder makes, as a table of function pointers: the real
// runtime in the extension, fakes that record the call sequence in the host-only tests (which
// hold the decoder's ordering rules in CI, where there is no GPU).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace lazymedia {
namespace cuda {

struct CudaApi {
  decltype(&cudaGetDevice) GetDevice;
  decltype(&cudaSetDevice) SetDevice;
  decltype(&cudaGetErrorString) GetErrorString;
  decltype(&cudaStreamCreateWithFlags) StreamCreateWithFlags;
  decltype(&cudaStreamDestroy) StreamDestroy;
  decltype(&cudaStreamSynchronize) StreamSynchronize;
  decltype(&cudaStreamWaitEvent) StreamWaitEvent;
  decltype(&cudaEventCreateWithFlags) EventCreateWithFlags;
  decltype(&cudaEventDestroy) EventDestroy;
  decltype(&cudaEventRecord) EventRecord;
  decltype(&cudaEventSynchronize) EventSynchronize;
  decltype(&cudaMemPoolCreate) MemPoolCreate;
  decltype(&cudaMemPoolDestroy) MemPoolDestroy;
  decltype(&cudaMemPoolSetAttribute) MemPoolSetAttribute;
  decltype(&cudaMallocFromPoolAsync) MallocFromPoolAsync;
  decltype(&cudaFreeAsync) FreeAsync;
  decltype(&cudaHostAlloc) HostAlloc;
  decltype(&cudaFreeHost) FreeHost;
  decltype(&cudaMalloc) Malloc;  // where the device has no stream-ordered pools
  decltype(&cudaFree) Free;
  decltype(&cudaDeviceGetAttribute) DeviceGetAttribute;
  // EXIF orientation of an h x w x c image from src to dst, enqueued on `stream` (device_ops.h).
  cudaError_t (*Orient)(const uint8_t* src, uint8_t* dst, int h, int w, int c, int orientation, cudaStream_t stream);
  // Planar RGB (three h x w planes, back to back) to HWC RGB with EXIF orientation, on `stream`
  // (nvjpeg_kernels.h): the engines' planar output interleaved in one pass.
  cudaError_t (*PlanarToInterleaved)(const uint8_t* planes, uint8_t* dst, int h, int w, int orientation,
                                     cudaStream_t stream);
};

// The real runtime (statically linked into the extension).
const CudaApi& cuda_runtime();

}  // namespace cuda
}  // namespace lazymedia
