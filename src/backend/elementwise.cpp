// Front-ends of RoPE, RMSNorm and SwiGLU: shape checks, workspace, backend dispatch.
#include "backend/rmsnorm.h"
#include "backend/rope.h"
#include "backend/swiglu.h"

namespace upipe {
namespace {

void rope_apply(Device& dev, const Mat& x, int d, const RowPositions& pos, const RopeParams& rp,
                int sign) {
  UPIPE_CHECK(d % 2 == 0 && d > 0 && d <= 1024 && x.cols % d == 0,
              "rope needs even d <= 1024 dividing {}", x.cols);
  UPIPE_CHECK(pos.total_rows() == x.rows, "rope positions cover {} rows, x has {}",
              pos.total_rows(), x.rows);
  dev.backend().rope(x, d, pos, rp, sign);
}

int64_t norm_group(const Mat& x, int64_t group) {
  const int64_t g = group == 0 ? x.cols : group;
  UPIPE_CHECK(g > 0 && x.cols % g == 0, "rmsnorm group {} does not divide {} columns", g, x.cols);
  return g;
}

}  // namespace

void rope_forward(Device& dev, const Mat& x, int d, const RowPositions& pos, const RopeParams& rp) {
  rope_apply(dev, x, d, pos, rp, +1);
}

void rope_backward(Device& dev, const Mat& x, int d, const RowPositions& pos,
                   const RopeParams& rp) {
  rope_apply(dev, x, d, pos, rp, -1);
}

int64_t rmsnorm_workspace_bytes(const Backend& be, int64_t group) {
  return be.rmsnorm_workspace_bytes(group);
}

void rmsnorm_forward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& y,
                     int64_t group) {
  const int64_t g = norm_group(x, group);
  UPIPE_CHECK(w.cols == g && y.rows == x.rows && y.cols == x.cols,
              "rmsnorm shapes: x {}x{} (group {}), w {}, y {}x{}", x.rows, x.cols, g, w.cols,
              y.rows, y.cols);
  Buffer ws(dev.mem(), rmsnorm_workspace_bytes(dev.backend(), g), Tag::kWorkspace);
  dev.backend().rmsnorm_forward(x, w, g, eps, y, ws.data());
}

void rmsnorm_backward(Device& dev, const Mat& x, const Mat& w, float eps, const Mat& dy,
                      const Mat& dx, const Mat& dw, int64_t group) {
  const int64_t g = norm_group(x, group);
  UPIPE_CHECK(dw.dtype == DType::kF32 && dw.cols == g && w.cols == g && dy.rows == x.rows &&
                  dy.cols == x.cols && dx.rows == x.rows && dx.cols == x.cols,
              "rmsnorm backward shapes");
  Buffer ws(dev.mem(), rmsnorm_workspace_bytes(dev.backend(), g), Tag::kWorkspace);
  dev.backend().rmsnorm_backward(x, w, g, eps, dy, dx, dw, ws.data());
}

int64_t swiglu_workspace_bytes(const Backend& be, int64_t cols) {
  return be.swiglu_workspace_bytes(cols);
}

void swiglu_forward(Device& dev, const Mat& a, const Mat& b, const Mat& h) {
  UPIPE_CHECK(a.rows == b.rows && a.cols == b.cols && h.rows == a.rows && h.cols == a.cols,
              "swiglu shapes");
  Buffer ws(dev.mem(), swiglu_workspace_bytes(dev.backend(), a.cols), Tag::kWorkspace);
  dev.backend().swiglu_forward(a, b, h, ws.data());
}

void swiglu_backward(Device& dev, const Mat& a, const Mat& b, const Mat& dh, const Mat& da,
                     const Mat& db) {
  UPIPE_CHECK(a.rows == b.rows && a.cols == b.cols && dh.rows == a.rows && dh.cols == a.cols &&
                  da.rows == a.rows && da.cols == a.cols && db.rows == a.rows && db.cols == a.cols,
              "swiglu backward shapes");
  Buffer ws(dev.mem(), swiglu_workspace_bytes(dev.backend(), a.cols), Tag::kWorkspace);
  dev.backend().swiglu_backward(a, b, dh, da, db, ws.data());
}

}  // namespace upipe
