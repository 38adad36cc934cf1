#include "model/param_source.h"

#include "core/check.h"
#include "model/hf_names.h"

namespace upipe {
namespace {

std::vector<ParamViews> unit_views(const ModelConfig& m, const ParamMap& p, const char* what) {
  std::vector<ParamViews> units;
  for (int u = 0; u < num_param_units(m); ++u) {
    ParamViews v;
    for (const HfTensorSpec& s : unit_tensors(m, u)) {
      const auto it = p.find(s.name);
      UPIPE_CHECK(it != p.end(), "{} {} is missing", what, s.name);
      v.emplace(s.name, it->second.mat());
    }
    units.push_back(std::move(v));
  }
  return units;
}

}  // namespace

FullParams::FullParams(const ModelConfig& m, const ParamMap& w, const ParamMap& g)
    : w_(unit_views(m, w, "parameter")),
      g_(g.empty() ? std::vector<ParamViews>{} : unit_views(m, g, "gradient")) {}

}  // namespace upipe
