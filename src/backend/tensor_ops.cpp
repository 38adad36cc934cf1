#include "backend/tensor_ops.h"

namespace upipe {

void zero(Device& dev, const Mat& x) {
  dev.backend().fill(x, 0.0f);
}

void fill(Device& dev, const Mat& x, float value) {
  dev.backend().fill(x, value);
}

void copy(Device& dev, const Mat& dst, const Mat& src) {
  UPIPE_CHECK(dst.rows == src.rows && dst.cols == src.cols, "copy of {}x{} into {}x{}", src.rows,
              src.cols, dst.rows, dst.cols);
  dev.backend().convert(dst, src);
}

void add_into(Device& dev, const Mat& dst, const Mat& src) {
  UPIPE_CHECK(dst.rows == src.rows && dst.cols == src.cols, "add_into: dst {}x{}, src {}x{}",
              dst.rows, dst.cols, src.rows, src.cols);
  dev.backend().add_into(dst, src);
}

void add_transposed(Device& dev, const Mat& dst, const Mat& src, float beta) {
  UPIPE_CHECK(dst.dtype == DType::kF32 && src.dtype == DType::kF32 && dst.rows == src.cols &&
                  dst.cols == src.rows,
              "add_transposed: dst {}x{}, src {}x{}", dst.rows, dst.cols, src.rows, src.cols);
  dev.backend().add_transposed(dst, src, beta);
}

namespace {

// The checks both row ops share: one id per row of `rows`, columns equal, every id a row of table.
void check_rows(const char* op, const Mat& rows, const Mat& table, std::span<const int32_t> ids) {
  UPIPE_CHECK(int64_t(ids.size()) == rows.rows && rows.cols == table.cols,
              "{}: {} ids for {}x{} rows of a {}x{} table", op, ids.size(), rows.rows, rows.cols,
              table.rows, table.cols);
  for (size_t r = 0; r < ids.size(); ++r)
    UPIPE_CHECK(ids[r] >= 0 && ids[r] < table.rows,
                "{}: id {} at row {} is not a row of a {}-row table", op, ids[r], r, table.rows);
}

}  // namespace

void gather_rows(Device& dev, const Mat& dst, const Mat& table, std::span<const int32_t> ids) {
  check_rows("gather_rows", dst, table, ids);
  if (!ids.empty()) dev.backend().gather_rows(dst, table, ids);
}

void scatter_add_rows(Device& dev, const Mat& table, const Mat& src, std::span<const int32_t> ids) {
  check_rows("scatter_add_rows", src, table, ids);
  if (!ids.empty()) dev.backend().scatter_add_rows(table, src, ids);
}

void upload(Device& dev, const float* src, const Mat& dst) {
  const int64_t rb = dst.cols * dtype_size(dst.dtype);
  std::vector<char> row(static_cast<size_t>(rb));
  for (int64_t r = 0; r < dst.rows; ++r) {
    from_f32(src + r * dst.cols, row.data(), dst.dtype, dst.cols);
    dev.copy(dst.at(r, 0), row.data(), rb, CopyKind::kHostToDevice);
  }
}

std::vector<float> download(Device& dev, const Mat& src) {
  const int64_t rb = src.cols * dtype_size(src.dtype);
  std::vector<char> row(static_cast<size_t>(rb));
  std::vector<float> out(static_cast<size_t>(src.rows * src.cols));
  for (int64_t r = 0; r < src.rows; ++r) {
    dev.copy(row.data(), src.at(r, 0), rb, CopyKind::kDeviceToHost);
    to_f32(row.data(), src.dtype, out.data() + r * src.cols, src.cols);
  }
  return out;
}

}  // namespace upipe
