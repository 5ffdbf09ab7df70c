// Every CUDA runtime and cuBLAS call goes through one check that turns a failure into a
// std::runtime_error naming the call and where it was made: a worker reports the message and
// the daemon answers the request with it, instead of a later kernel reading garbage.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace llmd::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA error ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) +
                           ") in " + what + " at " + file + ":" + std::to_string(line));
}

}  // namespace llmd::cuda

#define LLMD_CUDA_CHECK(call)                                                              \
  do {                                                                                     \
    const cudaError_t llmd_cuda_err_ = (call);                                             \
    if (llmd_cuda_err_ != cudaSuccess) ::llmd::cuda::throw_cuda_error(llmd_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: a bad launch configuration surfaces here, not at the next sync.
#define LLMD_CUDA_CHECK_LAUNCH() LLMD_CUDA_CHECK(cudaGetLastError())
