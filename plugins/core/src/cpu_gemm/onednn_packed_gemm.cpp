// The packed-operand GEMM of cpu_gemm.h on oneDNN 3.x's matmul, loaded at run time (onednn_lib.h).
//
// C (rows of A x n) = A B^T is computed as oneDNN's dst (n x 64) = src (n x k) * weights (k x 64) per block of 64 rows
// of A (kPackedRowBlock; an A of fewer rows is one block of its rows rounded up to 16, so that a 32-channel weight does
// not run half its products on zeros): the blocks are reordered once, at packing, into the layout oneDNN's matmul asks for (its
// brgemm kernels' blocked weights; the last block zero-padded to 64 rows), and every GEMM then reads them as they are.
// dst is written to a per-thread buffer and transposed into C (alpha, beta applied there): oneDNN's fast kernels write
// only a row-major dst. One primitive per (n, ldb, transposition of B) and operand, made at its first use and kept;
// every primitive is made and run with oneDNN's OpenMP team at 1 on the calling thread, and its scratchpad is the
// thread's own (user scratchpad mode), so threads may run one primitive at once.
// bfloat16 (onednn_pack_bf16): the blocks are packed as bf16, and each GEMM's B is converted to a dense bf16 (n x k)
// copy by a oneDNN reorder (per thread) before the bf16 matmul, which accumulates and writes dst in float32.
#include "onednn_packed_gemm.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "dcnkit/onednn_lib.h"

#if defined(DCNKIT_WITH_ONEDNN3_HEADERS)
#include <oneapi/dnnl/dnnl.h>
#endif

namespace dcnkit {

#if defined(DCNKIT_WITH_ONEDNN3_HEADERS)

namespace {

// The C API entry points used, typed from dnnl.h and found in the loaded library.
#define DCNKIT_DNNL_FNS(X)                                                                                    \
  X(dnnl_engine_create) X(dnnl_stream_create) X(dnnl_stream_destroy) X(dnnl_memory_desc_create_with_strides)  \
  X(dnnl_memory_desc_create_with_tag) X(dnnl_memory_desc_clone) X(dnnl_memory_desc_destroy)                   \
  X(dnnl_memory_desc_get_size) X(dnnl_matmul_primitive_desc_create) X(dnnl_reorder_primitive_desc_create)     \
  X(dnnl_primitive_desc_query_md) X(dnnl_primitive_desc_destroy) X(dnnl_primitive_create)                     \
  X(dnnl_primitive_destroy) X(dnnl_primitive_execute) X(dnnl_memory_create) X(dnnl_memory_set_data_handle)    \
  X(dnnl_memory_destroy) X(dnnl_primitive_attr_create) X(dnnl_primitive_attr_destroy)                         \
  X(dnnl_primitive_attr_set_scratchpad_mode) X(dnnl_primitive_desc_query)

struct Api {
#define DCNKIT_DNNL_MEMBER(f) decltype(&::f) f = nullptr;
  DCNKIT_DNNL_FNS(DCNKIT_DNNL_MEMBER)
#undef DCNKIT_DNNL_MEMBER
  dnnl_engine_t engine = nullptr;
  std::string error;  // empty: usable
};

Api load_api() {
  Api a;
  const OneDnnLib& l = onednn_lib();
  if (l.handle == nullptr) {
    a.error = "oneDNN was not found; tried:" + l.tried;
    return a;
  }
  if (l.major < 3) {
    a.error = "oneDNN " + std::to_string(l.major) + "." + std::to_string(l.minor) + " (" + l.path +
              ") has no matmul API of 3.x";
    return a;
  }
#define DCNKIT_DNNL_LOAD(f)                                         \
  a.f = reinterpret_cast<decltype(&::f)>(l.symbol(#f));             \
  if (a.f == nullptr) {                                             \
    a.error = "oneDNN at " + l.path + " has no " #f;                \
    return a;                                                       \
  }
  DCNKIT_DNNL_FNS(DCNKIT_DNNL_LOAD)
#undef DCNKIT_DNNL_LOAD
  OneDnnOnThisThread single;
  if (a.dnnl_engine_create(&a.engine, dnnl_cpu, 0) != dnnl_success) a.error = "oneDNN made no CPU engine";
  return a;  // the engine lives as long as the process
}

const Api& api() {
  static const Api a = load_api();
  return a;
}

// Owners of oneDNN objects: each releases its object with the matching destroy function.
template <typename H, dnnl_status_t (*Api::*Destroy)(H)>
struct Owned {
  H h = nullptr;
  Owned() = default;
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() {
    if (h) (api().*Destroy)(h);
  }
};
using Desc = Owned<dnnl_memory_desc_t, &Api::dnnl_memory_desc_destroy>;
using Mem = Owned<dnnl_memory_t, &Api::dnnl_memory_destroy>;
using PrimDesc = Owned<dnnl_primitive_desc_t, &Api::dnnl_primitive_desc_destroy>;
using Prim = Owned<dnnl_primitive_t, &Api::dnnl_primitive_destroy>;
using Stream = Owned<dnnl_stream_t, &Api::dnnl_stream_destroy>;
using Attr = Owned<dnnl_primitive_attr_t, &Api::dnnl_primitive_attr_destroy>;

bool ok(dnnl_status_t s) { return s == dnnl_success; }

Status dnnl_error(const char* what) { return Status::Internal(std::string("oneDNN: ") + what + " failed"); }

// A 2-D memory descriptor (f32 unless told) with explicit strides.
bool strided(dnnl_dim_t rows, dnnl_dim_t cols, dnnl_dim_t row_stride, dnnl_dim_t col_stride, Desc* d,
             dnnl_data_type_t type = dnnl_f32) {
  const dnnl_dims_t dims = {rows, cols};
  const dnnl_dims_t strides = {row_stride, col_stride};
  return ok(api().dnnl_memory_desc_create_with_strides(&d->h, 2, dims, type, strides));
}

struct Matmul {
  Prim prim;
  Desc src, dst;
  size_t scratch = 0;
  // bf16 weights: B (f32, as given) -> src (dense bf16 n x k), and B's own descriptor.
  Prim to_bf16;
  Desc b_f32;
};

// Whether a primitive descriptor is oneDNN's reference (scalar) implementation: slower than OpenBLAS by far.
bool is_reference(const_dnnl_primitive_desc_t pd) {
  const char* impl = nullptr;
  return !ok(api().dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl)) || impl == nullptr ||
         std::string(impl).rfind("ref", 0) == 0;
}

// 64-byte aligned bytes.
struct Aligned {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Aligned(size_t n) : bytes((n + 63) / 64 * 64) { p = std::aligned_alloc(64, bytes); }
  ~Aligned() { std::free(p); }
};

}  // namespace

struct OneDnnPackedA {
  dnnl_data_type_t type = dnnl_f32;  // of the packed blocks and the matmul's src (f32 or bf16)
  int64_t batch = 0, rows = 0, cols = 0, blocks = 0;
  int64_t block_rows = kPackedRowBlock;  // rows per block: kPackedRowBlock, or all the rows rounded up to 16
  size_t block_bytes = 0;
  Desc weights;  // one block: (cols x block_rows) in the matmul's own layout
  std::shared_ptr<Aligned> data;  // batch x blocks blocks
  std::mutex mutex;
  std::map<std::tuple<int64_t, int64_t, bool>, std::unique_ptr<Matmul>> matmuls;  // by (n, ldb, trans_b)

  const char* block(int64_t b, int64_t blk) const {
    return static_cast<const char*>(data->p) + static_cast<size_t>(b * blocks + blk) * block_bytes;
  }
  // The matmul for n columns of B (n x k at ldb, or k x n when !trans_b); null when oneDNN makes none.
  const Matmul* matmul(int64_t n, int64_t ldb, bool trans_b);
};

const Matmul* OneDnnPackedA::matmul(int64_t n, int64_t ldb, bool trans_b) {
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = matmuls[{n, ldb, trans_b}];
  if (slot) return slot->prim.h ? slot.get() : nullptr;
  slot = std::make_unique<Matmul>();
  Matmul& m = *slot;
  const Api& a = api();
  OneDnnOnThisThread single;  // the kernels chosen for one thread
  bool made = trans_b ? strided(n, cols, ldb, 1, &m.src) : strided(n, cols, 1, ldb, &m.src);
  if (made && type == dnnl_bf16) {
    std::swap(m.src.h, m.b_f32.h);
    PrimDesc rpd;
    made = strided(n, cols, cols, 1, &m.src, dnnl_bf16) &&
           ok(a.dnnl_reorder_primitive_desc_create(&rpd.h, m.b_f32.h, a.engine, m.src.h, a.engine, nullptr)) &&
           !is_reference(rpd.h) && ok(a.dnnl_primitive_create(&m.to_bf16.h, rpd.h));
  }
  const dnnl_dims_t dst_dims = {n, block_rows};
  Attr attr;
  PrimDesc pd;
  if (!made || !ok(a.dnnl_memory_desc_create_with_tag(&m.dst.h, 2, dst_dims, dnnl_f32, dnnl_ab)) ||
      !ok(a.dnnl_primitive_attr_create(&attr.h)) ||
      !ok(a.dnnl_primitive_attr_set_scratchpad_mode(attr.h, dnnl_scratchpad_mode_user)) ||
      !ok(a.dnnl_matmul_primitive_desc_create(&pd.h, a.engine, m.src.h, weights.h, nullptr, m.dst.h, attr.h)) ||
      (type == dnnl_bf16 && is_reference(pd.h)) || !ok(a.dnnl_primitive_create(&m.prim.h, pd.h))) {
    if (m.prim.h) a.dnnl_primitive_destroy(m.prim.h);
    m.prim.h = nullptr;
    return nullptr;
  }
  m.scratch = a.dnnl_memory_desc_get_size(a.dnnl_primitive_desc_query_md(pd.h, dnnl_query_scratchpad_md, 0));
  return &m;
}

std::string onednn_packed_unavailable() {
  const Api& a = api();
  return a.error;
}

std::string onednn_packed_version() {
  const OneDnnLib& l = onednn_lib();
  return std::to_string(l.major) + "." + std::to_string(l.minor) + "." + std::to_string(l.patch) + " (" + l.path + ")";
}

namespace {

// `op` packed with blocks of `type` (f32 or bf16); null where oneDNN makes no matmul for it (or only its reference
// implementation, for bf16). `reuse`: onednn_pack's.
std::shared_ptr<OneDnnPackedA> pack_as(const GemmOperand& op, dnnl_data_type_t type, bool reuse) {
  const Api& a = api();
  if (!a.error.empty() || op.dtype != DType::kFloat32 || op.batch <= 0 || op.rows <= 0 || op.cols <= 0 ||
      op.ld < op.cols || op.data == nullptr) {
    return nullptr;
  }
  auto p = std::make_shared<OneDnnPackedA>();
  p->type = type;
  p->batch = op.batch;
  p->rows = op.rows;
  p->cols = op.cols;
  p->block_rows = std::min<int64_t>(kPackedRowBlock, (op.rows + 15) / 16 * 16);
  p->blocks = (op.rows + p->block_rows - 1) / p->block_rows;
  const int64_t br = p->block_rows;
  OneDnnOnThisThread single;
  // The weights layout the matmul asks for (format "any"), for one block; the same for every n (checked by the
  // primitive made with it at each n: a layout it cannot take makes no primitive, and the GEMM falls back).
  Desc src_any, w_any, dst_any;
  const dnnl_dims_t src_dims = {1, op.cols}, w_dims = {op.cols, br}, dst_dims = {1, br};
  PrimDesc pd;
  if (!ok(a.dnnl_memory_desc_create_with_tag(&src_any.h, 2, src_dims, type, dnnl_ab)) ||
      !ok(a.dnnl_memory_desc_create_with_tag(&w_any.h, 2, w_dims, type, dnnl_format_tag_any)) ||
      !ok(a.dnnl_memory_desc_create_with_tag(&dst_any.h, 2, dst_dims, dnnl_f32, dnnl_ab)) ||
      !ok(a.dnnl_matmul_primitive_desc_create(&pd.h, a.engine, src_any.h, w_any.h, nullptr, dst_any.h, nullptr)) ||
      (type == dnnl_bf16 && is_reference(pd.h)) ||
      !ok(a.dnnl_memory_desc_clone(&p->weights.h, a.dnnl_primitive_desc_query_md(pd.h, dnnl_query_weights_md, 0)))) {
    return nullptr;
  }
  p->block_bytes = (a.dnnl_memory_desc_get_size(p->weights.h) + 63) / 64 * 64;
  const size_t bytes = p->block_bytes * static_cast<size_t>(p->batch * p->blocks);
  // With reuse, the thread's previous buffer when no packed operand holds it any more: a weight packed on every call
  // then writes to memory already mapped (a fresh allocation over glibc's mmap threshold faults in every page).
  thread_local std::shared_ptr<Aligned> spare;
  if (reuse && spare && spare.use_count() == 1 && spare->bytes >= bytes) {
    p->data = spare;
  } else {
    p->data = std::make_shared<Aligned>(bytes);
    if (reuse) spare = p->data;
  }
  // Each block as a (cols x block_rows) matrix: the block's rows of A, zero-padded, read transposed.
  Desc user;
  PrimDesc rpd;
  Prim reorder;
  Stream stream;
  if (p->data->p == nullptr || !strided(op.cols, br, 1, op.cols, &user) ||
      !ok(a.dnnl_reorder_primitive_desc_create(&rpd.h, user.h, a.engine, p->weights.h, a.engine, nullptr)) ||
      !ok(a.dnnl_primitive_create(&reorder.h, rpd.h)) ||
      !ok(a.dnnl_stream_create(&stream.h, a.engine, dnnl_stream_default_flags))) {
    return nullptr;
  }
  std::vector<float> rows(static_cast<size_t>(br * op.cols));
  Mem from, to;
  if (!ok(a.dnnl_memory_create(&from.h, user.h, a.engine, rows.data())) ||
      !ok(a.dnnl_memory_create(&to.h, p->weights.h, a.engine, p->data->p))) {
    return nullptr;
  }
  const float* src = static_cast<const float*>(op.data);
  for (int64_t b = 0; b < op.batch; ++b) {
    for (int64_t blk = 0; blk < p->blocks; ++blk) {
      std::fill(rows.begin(), rows.end(), 0.f);
      const int64_t r0 = blk * br, r1 = std::min(op.rows, r0 + br);
      for (int64_t r = r0; r < r1; ++r) {
        const float* row = src + b * op.stride + r * op.ld;
        std::copy(row, row + op.cols, rows.data() + (r - r0) * op.cols);
      }
      const dnnl_exec_arg_t args[] = {{DNNL_ARG_FROM, from.h}, {DNNL_ARG_TO, to.h}};
      if (!ok(a.dnnl_memory_set_data_handle(to.h, const_cast<char*>(p->block(b, blk)))) ||
          !ok(a.dnnl_primitive_execute(reorder.h, stream.h, 2, args))) {
        return nullptr;
      }
    }
  }
  return p;
}

}  // namespace

std::shared_ptr<OneDnnPackedA> onednn_pack(const GemmOperand& op, bool reuse) {
  return pack_as(op, dnnl_f32, reuse);
}

std::shared_ptr<OneDnnPackedA> onednn_pack_bf16(const GemmOperand& op) { return pack_as(op, dnnl_bf16, false); }

bool onednn_packed_fits(const OneDnnPackedA& p, const GemmArgs& g) {
  return g.dtype == DType::kFloat32 && !g.trans_a && g.batch == p.batch && g.k == p.cols && g.m > 0 && g.n > 0 &&
         g.a_row0 >= 0 && g.a_row0 % kPackedRowBlock == 0 && g.a_row0 + g.m <= p.rows &&
         ((g.a_row0 + g.m) % kPackedRowBlock == 0 || g.a_row0 + g.m == p.rows) && g.ldc >= g.n;
}

Status onednn_packed_gemm(OneDnnPackedA& p, const GemmArgs& g, bool* done) {
  *done = false;
  const Matmul* mm = p.matmul(g.n, g.ldb, g.trans_b);
  if (mm == nullptr) return Status::Ok();  // the caller runs the GEMM without the packed operand
  const Api& a = api();
  OneDnnOnThisThread single;
  thread_local std::vector<float> dst;
  thread_local std::vector<char> scratch;
  thread_local std::vector<uint16_t> b_bf16;  // bf16: B converted
  const int64_t br = p.block_rows;
  if (dst.size() < static_cast<size_t>(g.n * br)) dst.resize(static_cast<size_t>(g.n * br));
  if (scratch.size() < mm->scratch + 64) scratch.resize(mm->scratch + 64);
  void* scratch_p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t(63));
  const bool bf16 = p.type == dnnl_bf16;
  if (bf16 && b_bf16.size() < static_cast<size_t>(g.n * g.k)) b_bf16.resize(static_cast<size_t>(g.n * g.k));
  Stream stream;
  Mem src, w, out, pad, b_f32;
  if (!ok(a.dnnl_stream_create(&stream.h, a.engine, dnnl_stream_default_flags)) ||
      !ok(a.dnnl_memory_create(&src.h, mm->src.h, a.engine, bf16 ? b_bf16.data() : DNNL_MEMORY_NONE)) ||
      (bf16 && !ok(a.dnnl_memory_create(&b_f32.h, mm->b_f32.h, a.engine, DNNL_MEMORY_NONE))) ||
      !ok(a.dnnl_memory_create(&w.h, p.weights.h, a.engine, DNNL_MEMORY_NONE)) ||
      !ok(a.dnnl_memory_create(&out.h, mm->dst.h, a.engine, dst.data()))) {
    return dnnl_error("memory creation");
  }
  std::vector<dnnl_exec_arg_t> args = {{DNNL_ARG_SRC, src.h}, {DNNL_ARG_WEIGHTS, w.h}, {DNNL_ARG_DST, out.h}};
  if (mm->scratch > 0) {
    Desc sd;
    const dnnl_dims_t dims = {static_cast<dnnl_dim_t>(mm->scratch)};
    if (!ok(a.dnnl_memory_desc_create_with_tag(&sd.h, 1, dims, dnnl_u8, dnnl_a)) ||
        !ok(a.dnnl_memory_create(&pad.h, sd.h, a.engine, scratch_p))) {
      return dnnl_error("scratchpad creation");
    }
    args.push_back({DNNL_ARG_SCRATCHPAD, pad.h});
  }
  const int64_t blk0 = g.a_row0 / br;
  for (int64_t b = 0; b < g.batch; ++b) {
    const float* bb = static_cast<const float*>(g.b) + b * g.stride_b;
    float* c = static_cast<float*>(g.c) + b * g.stride_c;
    if (bf16) {
      const dnnl_exec_arg_t convert[] = {{DNNL_ARG_FROM, b_f32.h}, {DNNL_ARG_TO, src.h}};
      if (!ok(a.dnnl_memory_set_data_handle(b_f32.h, const_cast<float*>(bb))) ||
          !ok(a.dnnl_primitive_execute(mm->to_bf16.h, stream.h, 2, convert))) {
        return dnnl_error("bf16 conversion of B");
      }
    } else if (!ok(a.dnnl_memory_set_data_handle(src.h, const_cast<float*>(bb)))) {
      return dnnl_error("set_data_handle");
    }
    for (int64_t r = 0; r < g.m; r += br) {
      if (!ok(a.dnnl_memory_set_data_handle(w.h, const_cast<char*>(p.block(b, blk0 + r / br)))) ||
          !ok(a.dnnl_primitive_execute(mm->prim.h, stream.h, static_cast<int>(args.size()), args.data()))) {
        return dnnl_error("matmul execution");
      }
      // dst (n x block_rows) -> rows [r, r + block_rows) of C (ldc), transposed.
      const int64_t rows = std::min(br, g.m - r);
      constexpr int64_t kCols = 16;
      for (int64_t j0 = 0; j0 < g.n; j0 += kCols) {
        const int64_t j1 = std::min(g.n, j0 + kCols);
        for (int64_t i = 0; i < rows; ++i) {
          float* crow = c + (r + i) * g.ldc;
          const float* d = dst.data() + i;
          if (g.beta == 0.f) {
            for (int64_t j = j0; j < j1; ++j) crow[j] = g.alpha * d[j * br];
          } else {
            for (int64_t j = j0; j < j1; ++j) crow[j] = g.alpha * d[j * br] + g.beta * crow[j];
          }
        }
      }
    }
  }
  *done = true;
  return Status::Ok();
}

#else  // built without oneDNN 3.x's headers: nothing is packed

struct OneDnnPackedA {};
std::string onednn_packed_unavailable() { return "this library was built without oneDNN 3.x's headers"; }
std::string onednn_packed_version() { return ""; }
std::shared_ptr<OneDnnPackedA> onednn_pack(const GemmOperand&, bool) { return nullptr; }
std::shared_ptr<OneDnnPackedA> onednn_pack_bf16(const GemmOperand&) { return nullptr; }
bool onednn_packed_fits(const OneDnnPackedA&, const GemmArgs&) { return false; }
Status onednn_packed_gemm(OneDnnPackedA&, const GemmArgs&, bool* done) {
  *done = false;
  return Status::Ok();
}

#endif

}  // namespace dcnkit
