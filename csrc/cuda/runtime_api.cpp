#include "runtime_api.h"

#include "device_ops.h"
#include "nvjpeg_kernels.h"

namespace lazymedia {
namespace cuda {

const CudaApi& cuda_runtime() {
  static const CudaApi api{
      &cudaGetDevice,
      &cudaSetDevice,
      &cudaGetErrorString,
      &cudaStreamCreateWithFlags,
      &cudaStreamDestroy,
      &cudaStreamSynchronize,
      &cudaStreamWaitEvent,
      &cudaEventCreateWithFlags,
      &cudaEventDestroy,
      &cudaEventRecord,
      &cudaEventSynchronize,
      &cudaMemPoolCreate,
      &cudaMemPoolDestroy,
      &cudaMemPoolSetAttribute,
      &cudaMallocFromPoolAsync,
      &cudaFreeAsync,
      &cudaHostAlloc,
      &cudaFreeHost,
      &cudaMalloc,
      &cudaFree,
      &cudaDeviceGetAttribute,
      &launch_orient,
      &launch_planar_to_interleaved,
  };
  return api;
}

}  // namespace cuda
}  // namespace lazymedia
