// `upipe --version`: this build (version, git commit) and what it runs on here: the CPU kernels'
// path, the CUDA backend (built or not, whether this process can use a GPU, the CUDA libraries it
// loaded), the MPI library.
// What a bug report or a benchmark result should quote.
#include <fmt/format.h>

#include "apps/upipe/commands.h"
#include "backend/backend.h"
#include "backend/cpu/cpu_isa.h"
#include "comm/mpi/mpi_comm.h"
#include "core/build_info.h"
#if UPIPE_HAVE_CUDA
#include "comm/nccl/nccl_comm.h"
#endif

namespace upipe::app {

std::string version_text() {
  std::string isas;
  for (CpuIsa i : supported_cpu_isas())
    isas += fmt::format("{}{}", isas.empty() ? "" : " ", cpu_isa_name(i));
  std::string cuda = "not built (cmake -DUPIPE_CUDA=ON where nvcc is found)";
  if (cuda_backend_built()) {
    std::string why;
    cuda =
        cuda_device_available(&why) ? "built; a GPU is available" : fmt::format("built; {}", why);
    cuda += fmt::format("; {}", cuda_libraries());
#if UPIPE_HAVE_CUDA
    cuda += fmt::format(", NCCL {}", nccl_library_version());
#endif
  }
  return fmt::format(
      "upipe {}\n"
      "cpu: {}, kernels on {} (this CPU has: {}), oneDNN on {}\n"
      "cuda: {}\n"
      "mpi: {}",
      build_id(), cpu_model_name(), cpu_isa_name(cpu_isa()), isas, onednn_cpu_isa(), cuda,
      MpiRuntime::library_version());
}

}  // namespace upipe::app
