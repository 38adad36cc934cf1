#include "plan/host_memory.h"

#include <algorithm>
#include <map>

#include "core/check.h"
#include "core/checked.h"

namespace upipe {

std::optional<HostOverMemory> host_over_memory(const Plan& p, bool cpu,
                                               const std::vector<std::string>& hosts,
                                               const std::vector<int64_t>& memory) {
  UPIPE_CHECK(hosts.size() == memory.size(), "{} host names for {} memories", hosts.size(),
              memory.size());
  auto rank_plan = [&](size_t r) -> std::pair<int64_t, int64_t> {  // device, host peaks
    if (r < p.ranks.size()) return {p.ranks[r].device_peak, p.ranks[r].host_peak};
    return {p.device_peak, p.host_peak};
  };
  std::map<std::string, std::vector<size_t>> ranks_of;  // by name: the same order on every rank
  for (size_t r = 0; r < hosts.size(); ++r) ranks_of[hosts[r]].push_back(r);
  for (const auto& [host, ranks] : ranks_of) {
    int64_t need = 0, most = 0, most_host = 0;
    for (size_t r : ranks) {
      const auto [dev, host_peak] = rank_plan(r);
      const int64_t mine = checked_add(cpu ? dev : 0, host_peak, "a rank's planned bytes");
      need = checked_add(need, mine, "the host's planned bytes");
      most = std::max(most, mine);
      most_host = std::max(most_host, host_peak);
    }
    const int64_t have = memory[ranks.front()];
    if (need <= have) continue;
    HostOverMemory o{host, int(ranks.size()), need, most, have, 0, 0};
    const int64_t share = have / int64_t(ranks.size());
    // Whole GiB below the share: what is left of it beside the other arena's peak.
    auto gib_floor = [](int64_t b) { return b > 0 ? b >> 30 << 30 : 0; };
    if (cpu)
      o.device_share = gib_floor(share - most_host);
    else
      o.host_share = gib_floor(share);
    return o;
  }
  return std::nullopt;
}

}  // namespace upipe
