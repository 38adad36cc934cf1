// cos/sin of pos * inv_freq[i] for consecutive positions, for the CPU RoPE kernel. Exact fp64
// sincos at every multiple of kRopeAnchor, then rotation by inv_freq[i] in fp64 (error ~1e-15
// after 63 steps): a position's values depend only on the position, never on where a shard
// starts, and cost a few FMAs instead of a sincos.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace upipe::cpu {

constexpr int64_t kRopeAnchor = 64;

class RopeAngles {
 public:
  RopeAngles(int half, const std::vector<double>& inv_freq) : half_(half) {
    for (int i = 0; i < half; ++i) {
      inv_[i] = inv_freq[size_t(i)];
      step_c_[i] = std::cos(inv_[i]);
      step_s_[i] = std::sin(inv_[i]);
    }
  }
  // Positions the generator at `pos` (anchor, then steps forward).
  void seek(int64_t pos) {
    pos_ = pos - pos % kRopeAnchor;
    for (int i = 0; i < half_; ++i) {
      c_[i] = std::cos(double(pos_) * inv_[i]);
      s_[i] = std::sin(double(pos_) * inv_[i]);
    }
    while (pos_ < pos) advance();
  }
  void advance() {
    ++pos_;
    if (pos_ % kRopeAnchor == 0) {
      seek(pos_);
      return;
    }
    for (int i = 0; i < half_; ++i) {
      const double c = c_[i] * step_c_[i] - s_[i] * step_s_[i];
      s_[i] = s_[i] * step_c_[i] + c_[i] * step_s_[i];
      c_[i] = c;
    }
  }
  double cos(int i) const { return c_[i]; }
  double sin(int i) const { return s_[i]; }

 private:
  int half_;
  int64_t pos_ = 0;
  double inv_[512], step_c_[512], step_s_[512], c_[512], s_[512];
};

}  // namespace upipe::cpu
