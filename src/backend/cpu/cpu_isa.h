// The vector instruction set the CPU kernels run on, chosen once per process at run time: the
// widest path this CPU has, or the one UPIPE_CPU_ISA names. The kernels are compiled for every
// path (Google Highway's foreach_target: AVX2 and AVX-512) and dispatched through
// HWY_DYNAMIC_DISPATCH; avx512bf16 is the AVX-512 code with the bf16 attention kernels on the
// AVX512-BF16 dot-product instructions, amx that with the bf16 attention products on AMX tiles
// (docs/kernels.md, "Dispatch").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace upipe {

// Narrowest first. avx2: AVX2 + FMA (x86-64-v3, the build's baseline); avx512: AVX-512 F, VL, DQ,
// BW; avx512bf16: that plus AVX512-BF16; amx: that plus AMX-TILE and AMX-BF16, with the OS's
// permission to use the tile registers.
enum class CpuIsa { kAvx2, kAvx512, kAvx512Bf16, kAmx };

// The environment variable that forces a path ("avx2", "avx512", "avx512bf16", "amx").
inline constexpr const char* kCpuIsaEnv = "UPIPE_CPU_ISA";

const char* cpu_isa_name(CpuIsa isa);
std::optional<CpuIsa> parse_cpu_isa(std::string_view name);

// The paths this CPU can run, narrowest first (never empty: the binary itself needs AVX2).
std::vector<CpuIsa> supported_cpu_isas();

// The path in use. The first call chooses it: UPIPE_CPU_ISA if set (ConfigError, one line, if
// the name is unknown or the CPU lacks it), else the widest supported path.
CpuIsa cpu_isa();

// Switches every CPU kernel to `isa` (tests and benchmarks compare paths in one process);
// ConfigError if the CPU lacks it.
void set_cpu_isa(CpuIsa isa);

// Highway's name of the target the kernels dispatch to now: "AVX2" on the avx2 path, "AVX3"
// (AVX-512) on the AVX-512 paths.
std::string cpu_vector_target();

// The instruction set oneDNN's GEMMs run on ("avx512_core_bf16", "avx2"): its own choice, which
// ONEDNN_MAX_CPU_ISA caps (UPIPE_CPU_ISA does not).
std::string onednn_cpu_isa();

// Whether the CPU has PREFETCHW (CPUID 0x80000001 ECX bit 8; AMD, Intel from Broadwell): the
// memory-bound kernels use it to ask for lines they are about to write.
bool cpu_has_prefetchw();

// The CPU's brand string ("AMD EPYC 9R14 96-Core Processor"), for benchmark headers.
std::string cpu_model_name();

}  // namespace upipe
