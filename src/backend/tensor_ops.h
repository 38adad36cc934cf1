// Small data-movement ops on matrix views (zero, fill, copy with conversion, add, the embedding's
// row gather and scatter-add), and the transfers between host code and device tensors: host code
// never reads or writes device memory itself, it uploads and downloads through the backend's
// copies.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/device.h"

namespace upipe {

void zero(Device& dev, const Mat& x);
void fill(Device& dev, const Mat& x, float value);
// dst = src (same shape; dtypes may differ, converted through fp32).
void copy(Device& dev, const Mat& dst, const Mat& src);
// dst += src (same shape; dtypes may differ: the sum is taken in fp32 and rounded once into dst).
void add_into(Device& dev, const Mat& dst, const Mat& src);
// dst (r, c) = beta * dst + src^T, src (c, r); both fp32.
void add_transposed(Device& dev, const Mat& dst, const Mat& src, float beta);
// Embedding rows (Backend::gather_rows, scatter_add_rows): dst row r = table row ids[r]; table
// row ids[r] += src row r, r ascending. Every id must name a row of table.
void gather_rows(Device& dev, const Mat& dst, const Mat& table, std::span<const int32_t> ids);
void scatter_add_rows(Device& dev, const Mat& table, const Mat& src, std::span<const int32_t> ids);

// dst (device, any dtype) <- src, rows * cols fp32 values in row-major order (host).
void upload(Device& dev, const float* src, const Mat& dst);
// The values of src (device, any dtype) as fp32, row-major (host).
std::vector<float> download(Device& dev, const Mat& src);

}  // namespace upipe
