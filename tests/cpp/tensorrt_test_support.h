// Host stand-ins for what TensorRT hands a plugin, for tensorrt_lifecycle_test.cpp and tensorrt_enqueue_cuda.cpp:
// the logger and its finder, an IExprBuilder that folds constants, a resource context, and PluginField collections
// as the ONNX parser fills them. Included once, inside each program's namespace.
#pragma once

// ---------------------------------------------------------------------------------------------
// Logger

struct TestLogger : ILogger {
  std::vector<std::string> lines;  // warnings and errors
  void log(Severity s, const char* msg) noexcept override {
    if (s <= Severity::kWARNING) lines.emplace_back(msg);
  }
};

struct TestFinder : ILoggerFinder {
  ILogger* logger = nullptr;
  ILogger* findLogger() override { return logger; }
};

TestLogger g_logger;

// ---------------------------------------------------------------------------------------------
// IExprBuilder that folds constants; a non-constant expression is an opaque symbol.

struct ExprImpl : apiv::VDimensionExpr {
  bool constant = false;
  int64_t value = 0;
  bool isConstant() const override { return constant; }
  int64_t getConstantValue() const override { return constant ? value : INT64_MIN; }
  bool isSizeTensor() const override { return false; }
};

class Expr : public IDimensionExpr {
 public:
  explicit Expr(apiv::VDimensionExpr* impl) { mImpl = impl; }
};

int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

struct BuilderImpl : apiv::VExprBuilder {
  std::vector<std::unique_ptr<ExprImpl>> impls;
  std::vector<std::unique_ptr<Expr>> exprs;

  const IDimensionExpr* make(bool c, int64_t v) {
    impls.push_back(std::make_unique<ExprImpl>());
    impls.back()->constant = c;
    impls.back()->value = v;
    exprs.push_back(std::make_unique<Expr>(impls.back().get()));
    return exprs.back().get();
  }
  const IDimensionExpr* symbol() { return make(false, 0); }
  const IDimensionExpr* constant(int64_t v) override { return make(true, v); }
  const IDimensionExpr* operation(DimensionOperation op, const IDimensionExpr& a, const IDimensionExpr& b) override {
    if (!a.isConstant() || !b.isConstant()) return symbol();
    const int64_t x = a.getConstantValue(), y = b.getConstantValue();
    switch (op) {
      case DimensionOperation::kSUM: return constant(x + y);
      case DimensionOperation::kPROD: return constant(x * y);
      case DimensionOperation::kMAX: return constant(x > y ? x : y);
      case DimensionOperation::kMIN: return constant(x < y ? x : y);
      case DimensionOperation::kSUB: return constant(x - y);
      case DimensionOperation::kEQUAL: return constant(x == y);
      case DimensionOperation::kLESS: return constant(x < y);
      case DimensionOperation::kFLOOR_DIV: return constant(floor_div(x, y));
      case DimensionOperation::kCEIL_DIV: return constant(-floor_div(-x, y));
    }
    return nullptr;
  }
  const IDimensionExpr* declareSizeTensor(int32_t, const IDimensionExpr&, const IDimensionExpr&) override {
    return nullptr;
  }
};

class Builder : public IExprBuilder {
 public:
  explicit Builder(apiv::VExprBuilder* impl) { mImpl = impl; }
};

// ---------------------------------------------------------------------------------------------
// Fields as the ONNX parser passes them: INT/INTS -> kINT32, FLOAT(S) -> kFLOAT32, STRING -> kCHAR.

struct Field {
  std::string name;
  PluginFieldType type;
  std::vector<int32_t> ints;
  std::vector<float> floats;
  std::string s;
};

Field ints(const char* n, std::vector<int32_t> v) { return {n, PluginFieldType::kINT32, std::move(v), {}, ""}; }
Field flt(const char* n, float v) { return {n, PluginFieldType::kFLOAT32, {}, {v}, ""}; }
Field flts(const char* n, std::vector<float> v) { return {n, PluginFieldType::kFLOAT32, {}, std::move(v), ""}; }
Field str(const char* n, const char* v) { return {n, PluginFieldType::kCHAR, {}, {}, v}; }

struct Collection {
  std::vector<PluginField> fields;
  PluginFieldCollection fc{};
  explicit Collection(const std::vector<Field>& src) {
    for (const Field& f : src) {
      const void* data = f.type == PluginFieldType::kINT32 ? static_cast<const void*>(f.ints.data())
                         : f.type == PluginFieldType::kFLOAT32 ? static_cast<const void*>(f.floats.data())
                                                               : static_cast<const void*>(f.s.data());
      const int32_t len = static_cast<int32_t>(f.type == PluginFieldType::kINT32     ? f.ints.size()
                                               : f.type == PluginFieldType::kFLOAT32 ? f.floats.size()
                                                                                     : f.s.size());
      fields.emplace_back(f.name.c_str(), data, f.type, len);
    }
    fc.nbFields = static_cast<int32_t>(fields.size());
    fc.fields = fields.data();
  }
};

// A field collection's contents as text, to compare two serializations.
std::string fields_text(const PluginFieldCollection* fc) {
  if (fc == nullptr) return "<null>";
  std::string s;
  for (int32_t i = 0; i < fc->nbFields; ++i) {
    const PluginField& f = fc->fields[i];
    s += std::string(f.name) + ":" + std::to_string(static_cast<int>(f.type)) + ":" + std::to_string(f.length) + "=";
    for (int32_t j = 0; j < f.length; ++j) {
      if (f.type == PluginFieldType::kINT32) s += std::to_string(static_cast<const int32_t*>(f.data)[j]) + ",";
      if (f.type == PluginFieldType::kFLOAT32) s += std::to_string(static_cast<const float*>(f.data)[j]) + ",";
      if (f.type == PluginFieldType::kCHAR) s += static_cast<const char*>(f.data)[j];
    }
    s += ";";
  }
  return s;
}

// ---------------------------------------------------------------------------------------------
// Plugin access

template <typename T>
T* cap(IPluginV3* p, PluginCapabilityType t) {
  return static_cast<T*>(p->getCapabilityInterface(t));
}

Dims dims_of(const std::vector<int64_t>& v) {
  Dims d{};
  d.nbDims = static_cast<int32_t>(v.size());
  for (size_t i = 0; i < v.size(); ++i) d.d[i] = v[i];
  return d;
}

// A resource context as TensorRT hands one per execution context to attachToContext.
class TestResourceContext final : public IPluginResourceContext {
 public:
  IGpuAllocator* getGpuAllocator() const noexcept override { return nullptr; }
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
};
