// Choosing the CPU kernels' instruction set: Highway's CPU detection for AVX2 and AVX-512 (it
// also checks that the OS saves the vector registers), CPUID leaf 7 subleaf 1 for AVX512-BF16,
// and hwy::DisableTargets to make every HWY_DYNAMIC_DISPATCH use the chosen path.
#include "backend/cpu/cpu_isa.h"

#include <cpuid.h>
#include <fmt/format.h>
#include <hwy/targets.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/errors.h"

namespace upipe {
namespace {

constexpr CpuIsa kAll[] = {CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16, CpuIsa::kAmx};

bool has_avx512_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return false;
  return (a >> 5) & 1u;
}

// AMX-TILE and AMX-BF16 (CPUID 7.0 EDX bits 24 and 22), the tile state enabled in XCR0 (bits 17
// and 18), and Linux's permission for this process to use the tile data (arch_prctl
// ARCH_REQ_XCOMP_PERM; without it the first tile instruction faults). Asked once.
bool has_amx_bf16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  if (!((d >> 24) & 1u) || !((d >> 22) & 1u)) return false;
  if (!__get_cpuid(1, &a, &b, &c, &d) || !((c >> 27) & 1u)) return false;  // OSXSAVE
  unsigned lo = 0, hi = 0;
  asm volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;
#ifdef SYS_arch_prctl
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

// -1: not chosen yet.
std::atomic<int> g_isa{-1};
std::mutex g_choose;

void apply(CpuIsa isa) {
  // The AVX-512 table entries serve both AVX-512 paths; AVX3_DL is never compiled.
  hwy::DisableTargets(isa == CpuIsa::kAvx2 ? (HWY_AVX3 | HWY_AVX3_DL) : 0);
  g_isa.store(int(isa));
}

std::string names() {
  std::string s;
  for (CpuIsa i : supported_cpu_isas()) s += (s.empty() ? "" : ", ") + std::string(cpu_isa_name(i));
  return s;
}

}  // namespace

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx512Bf16:
      return "avx512bf16";
    case CpuIsa::kAmx:
      return "amx";
  }
  return "?";
}

std::optional<CpuIsa> parse_cpu_isa(std::string_view name) {
  for (CpuIsa i : kAll)
    if (name == cpu_isa_name(i)) return i;
  return std::nullopt;
}

std::vector<CpuIsa> supported_cpu_isas() {
  // Detected before the first apply() narrows what hwy::SupportedTargets reports.
  static const std::vector<CpuIsa> have = [] {
    std::vector<CpuIsa> v{CpuIsa::kAvx2};
    if (hwy::SupportedTargets() & HWY_AVX3) {
      v.push_back(CpuIsa::kAvx512);
      if (has_avx512_bf16()) {
        v.push_back(CpuIsa::kAvx512Bf16);
        if (has_amx_bf16()) v.push_back(CpuIsa::kAmx);
      }
    }
    return v;
  }();
  return have;
}

CpuIsa cpu_isa() {
  if (const int cur = g_isa.load(); cur >= 0) return CpuIsa(cur);
  const std::lock_guard<std::mutex> lock(g_choose);
  if (const int cur = g_isa.load(); cur >= 0) return CpuIsa(cur);
  const std::vector<CpuIsa> have = supported_cpu_isas();
  const char* env = std::getenv(kCpuIsaEnv);
  if (env == nullptr || *env == '\0') {
    apply(have.back());
    return have.back();
  }
  const std::optional<CpuIsa> want = parse_cpu_isa(env);
  if (!want)
    throw ConfigError(fmt::format("{}={} is not a CPU path; use avx2, avx512, avx512bf16 or amx",
                                  kCpuIsaEnv, env));
  set_cpu_isa(*want);
  return *want;
}

void set_cpu_isa(CpuIsa isa) {
  for (CpuIsa i : supported_cpu_isas())
    if (i == isa) return apply(isa);
  throw ConfigError(
      fmt::format("{}={}: this CPU lacks it (it has {})", kCpuIsaEnv, cpu_isa_name(isa), names()));
}

bool cpu_has_prefetchw() {
  static const bool have = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(0x80000001u, &a, &b, &c, &d) && ((c >> 8) & 1u);
  }();
  return have;
}

std::string cpu_model_name() {
  unsigned r[12] = {};
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000004u) return "unknown x86-64 CPU";
  for (unsigned leaf = 0; leaf < 3; ++leaf)
    __get_cpuid(0x80000002u + leaf, &r[4 * leaf], &r[4 * leaf + 1], &r[4 * leaf + 2],
                &r[4 * leaf + 3]);
  char s[49] = {};
  std::memcpy(s, r, 48);
  std::string name(s);
  const size_t first = name.find_first_not_of(' '), last = name.find_last_not_of(' ');
  return first == std::string::npos ? "unknown x86-64 CPU" : name.substr(first, last - first + 1);
}

}  // namespace upipe
