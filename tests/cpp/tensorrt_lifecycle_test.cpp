// Drives every creator of libdcnkit_trt.so through TensorRT's plugin lifecycle on the host, without
// TensorRT's libraries or a GPU: the few interfaces a plugin calls back into (IExprBuilder through
// apiv::VExprBuilder, ILoggerFinder, IPluginResourceContext, and cuBLAS's handle calls) are implemented here.
// What it checks comes from its own table of the expected creators, fields and output shapes
// (tensorrt_lifecycle_cases.h, written from the operator contract, not read from the library's sources) and
// tensorrt_runtime_checks.h. Build with -rdynamic (the cuBLAS seam).
// Usage: tensorrt_lifecycle_test /path/to/libdcnkit_trt.so [--nvinfer /path/to/fake/libnvinfer.so.N | --list |
//                                                          --expect-refusal]
// It compiles against the headers of every TensorRT from 10.0 to 11.x; each build is the host of that release.
// --expect-refusal: the process runs a TensorRT the library does not serve (a stand-in libnvinfer loaded first, e.g.
// through LD_PRELOAD): getCreators offers nothing and nothing reaches this host's logger.
// With --nvinfer the library is first loaded the way IPluginRegistry::loadLibrary loads it, through the fake
// registry of tests/cpp/fake_nvinfer.cpp, which fails any registry call made from inside the library.
// Prints one line per failure and "N passed, M failed" last; exits 1 on any failure.
#include <NvInferRuntime.h>
#include <dlfcn.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

int g_passed = 0, g_failed = 0;

void check(bool ok, const std::string& what) {
  if (ok) {
    ++g_passed;
  } else {
    ++g_failed;
    std::printf("FAILED: %s\n", what.c_str());
  }
}

#include "tensorrt_registry_compat.h"
#include "tensorrt_test_support.h"
#include "tensorrt_lifecycle_cases.h"

// ---------------------------------------------------------------------------------------------

std::string shape_text(const std::vector<int64_t>& v) {
  std::string s = "(";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + ")";
}

std::vector<DynamicPluginTensorDesc> dyn_descs(const std::vector<std::vector<int64_t>>& shapes, DataType t) {
  std::vector<DynamicPluginTensorDesc> d(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    d[i].desc.dims = dims_of(shapes[i]);
    d[i].desc.type = t;
    d[i].desc.format = TensorFormat::kLINEAR;
    d[i].desc.scale = 1.f;
    d[i].min = d[i].opt = d[i].max = d[i].desc.dims;
  }
  return d;
}

std::vector<PluginTensorDesc> descs(const std::vector<std::vector<int64_t>>& shapes, DataType t) {
  std::vector<PluginTensorDesc> d(shapes.size());
  for (size_t i = 0; i < shapes.size(); ++i) {
    d[i].dims = dims_of(shapes[i]);
    d[i].type = t;
    d[i].format = TensorFormat::kLINEAR;
    d[i].scale = 1.f;
  }
  return d;
}

// The case's index tables (Case::index_inputs) in type t; the other descs as they are.
void set_type(DynamicPluginTensorDesc& d, DataType t) { d.desc.type = t; }
void set_type(PluginTensorDesc& d, DataType t) { d.type = t; }
template <typename Desc>
std::vector<Desc> index_typed(std::vector<Desc> d, const Case& c, DataType t = DataType::kINT64) {
  for (size_t i : c.index_inputs)
    if (i < d.size()) set_type(d[i], t);
  return d;
}

bool is_index_input(const Case& c, size_t i) {
  for (size_t x : c.index_inputs)
    if (x == i) return true;
  return false;
}

// Output shapes through the test builder; `symbolic_first`: input batch_source's dim 0 is a symbol.
bool output_shapes(IPluginV3OneBuild* b, const Case& c, bool symbolic_first, std::vector<DimsExprs>* out,
                   const IDimensionExpr** symbol, BuilderImpl* impl) {
  Builder builder(impl);
  std::vector<DimsExprs> in(c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    in[i].nbDims = static_cast<int32_t>(c.inputs[i].size());
    for (size_t d = 0; d < c.inputs[i].size(); ++d) in[i].d[d] = impl->constant(c.inputs[i][d]);
  }
  if (symbolic_first) {
    *symbol = impl->symbol();
    in[c.batch_source].d[0] = *symbol;
  }
  out->assign(c.outputs.size(), DimsExprs{});
  return b->getOutputShapes(in.data(), static_cast<int32_t>(in.size()), nullptr, 0, out->data(),
                            static_cast<int32_t>(out->size()), builder) == 0;
}

void run_case(IPluginCreatorV3One* creator, const Case& c) {
  const std::string op = c.name;
  // Declared fields.
  const PluginFieldCollection* names = creator->getFieldNames();
  check(names != nullptr && names->nbFields == static_cast<int32_t>(c.declared.size()),
        op + ": getFieldNames declares " + std::to_string(c.declared.size()) + " fields");
  for (size_t i = 0; names != nullptr && i < c.declared.size() && i < static_cast<size_t>(names->nbFields); ++i) {
    const PluginField& f = names->fields[i];
    const FieldDecl& e = c.declared[i];
    check(std::strcmp(f.name, e.name) == 0 && f.type == e.type && (e.length == 0 || f.length == e.length),
          op + ": declared field " + std::to_string(i) + " is " + e.name);
  }

  // Build-time plugin from fields as the parser gives them.
  Collection fc(c.fields);
  std::unique_ptr<IPluginV3> plugin(creator->createPlugin("node0", &fc.fc, TensorRTPhase::kBUILD));
  check(plugin != nullptr, op + ": createPlugin(kBUILD) with good fields");
  if (!plugin) return;
  auto* core = cap<IPluginV3OneCore>(plugin.get(), PluginCapabilityType::kCORE);
  auto* build = cap<IPluginV3OneBuild>(plugin.get(), PluginCapabilityType::kBUILD);
  auto* runtime = cap<IPluginV3OneRuntime>(plugin.get(), PluginCapabilityType::kRUNTIME);
  check(core && build && runtime, op + ": all three capabilities");
  if (!core || !build || !runtime) return;
  check(std::string(core->getPluginName()) == op && std::string(core->getPluginVersion()) == "1" &&
            std::string(core->getPluginNamespace()) == c.ns,
        op + ": name/version/namespace");

  // Outputs: count, types.
  const int32_t nout = static_cast<int32_t>(c.outputs.size());
  check(build->getNbOutputs() == nout, op + ": getNbOutputs");
  for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16}) {
    std::vector<DataType> in(c.inputs.size(), t), out(c.outputs.size(), DataType::kINT8);
    const int32_t rc = build->getOutputDataTypes(out.data(), nout, in.data(), static_cast<int32_t>(in.size()));
    bool same = rc == 0;
    for (DataType o : out) same = same && o == t;
    check(same, op + ": output types follow the input type " + std::to_string(static_cast<int>(t)));
  }

  // Output shapes: constants fold to the expected dims; a symbolic batch/RoI count passes through.
  {
    BuilderImpl impl;
    std::vector<DimsExprs> out;
    const IDimensionExpr* sym = nullptr;
    const bool ok = output_shapes(build, c, false, &out, &sym, &impl);
    check(ok, op + ": getOutputShapes");
    for (int32_t o = 0; ok && o < nout; ++o) {
      std::vector<int64_t> got;
      bool constant = true;
      for (int32_t d = 0; d < out[o].nbDims; ++d) {
        constant = constant && out[o].d[d] && out[o].d[d]->isConstant();
        got.push_back(constant ? out[o].d[d]->getConstantValue() : -1);
      }
      check(constant && got == c.outputs[o],
            op + ": output " + std::to_string(o) + " shape " + shape_text(got) + " == " + shape_text(c.outputs[o]));
    }
    BuilderImpl impl2;
    const bool ok2 = output_shapes(build, c, true, &out, &sym, &impl2);
    check(ok2 && out[0].d[0] == sym && out[0].d[1] && out[0].d[1]->isConstant(),
          op + ": symbolic dim 0 of input " + std::to_string(c.batch_source) + " is the outputs' dim 0");
  }

  // Formats and types: linear float32/float16/bfloat16, every tensor in the type of input 0; index tables int32
  // or int64, the first fixing the others' type (int64 here).
  {
    const size_t n = c.inputs.size() + c.outputs.size();
    std::vector<std::vector<int64_t>> all = c.inputs;
    all.insert(all.end(), c.outputs.begin(), c.outputs.end());
    size_t first_map = 0;
    while (first_map < c.inputs.size() && c.inputs[first_map].size() != 4) ++first_map;
    for (size_t pos = 0; pos < n; ++pos) {
      for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kINT32, DataType::kINT64,
                         DataType::kINT8}) {
        for (TensorFormat f : {TensorFormat::kLINEAR, TensorFormat::kCHW32, TensorFormat::kHWC8}) {
          auto d = index_typed(dyn_descs(all, DataType::kFLOAT), c);
          d[pos].desc.type = t;
          d[pos].desc.format = f;
          const bool got = build->supportsFormatCombination(static_cast<int32_t>(pos), d.data(),
                                                            static_cast<int32_t>(c.inputs.size()), nout);
          const bool float_type = t == DataType::kFLOAT || t == DataType::kHALF || t == DataType::kBF16;
          // Position 0 (the features, or MultiLevelRoIAlign's RoIs) and the first map take any float type;
          // then everything else must be in the features' type (float32 here; RoIs: tensorrt_runtime_checks.h).
          const bool index_type = t == DataType::kINT32 || t == DataType::kINT64;
          const bool want =
              f == TensorFormat::kLINEAR &&
              (is_index_input(c, pos) ? (pos == c.index_inputs[0] ? index_type : t == DataType::kINT64)
                                      : (pos == 0 || pos == first_map ? float_type : t == DataType::kFLOAT));
          check(got == want, op + ": supportsFormatCombination pos " + std::to_string(pos) + " type " +
                                 std::to_string(static_cast<int>(t)) + " format " + std::to_string(static_cast<int>(f)));
        }
      }
    }
    // Whole combinations, as an INT8 (Q/DQ) network offers them: every tensor in one float type is taken at every
    // position; all in int8 is not taken (no int8 I/O: refused at the features, so TensorRT puts its Q/DQ layers and
    // reformats around the plugin; the loop above refuses int8 there alone too).
    const auto nin = static_cast<int32_t>(c.inputs.size());
    for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16, DataType::kINT8}) {
      auto d = index_typed(dyn_descs(all, t), c);
      bool every = true;
      for (size_t pos = 0; pos < n; ++pos)
        every = every && build->supportsFormatCombination(static_cast<int32_t>(pos), d.data(), nin, nout);
      check(every == (t != DataType::kINT8),
            op + ": all tensors in type " + std::to_string(static_cast<int>(t)) +
                (t == DataType::kINT8 ? " refused" : " accepted at every position"));
    }
  }

  // configurePlugin + getWorkspaceSize; bad shapes are rejected with a log line.
  {
    auto in = index_typed(dyn_descs(c.inputs, DataType::kFLOAT), c);
    auto out = dyn_descs(c.outputs, DataType::kFLOAT);
    check(build->configurePlugin(in.data(), static_cast<int32_t>(in.size()), out.data(), nout) == 0,
          op + ": configurePlugin with good shapes");
    const size_t ws = build->getWorkspaceSize(in.data(), static_cast<int32_t>(in.size()), out.data(), nout);
    check(ws >= c.min_workspace, op + ": workspace " + std::to_string(ws) + " >= " + std::to_string(c.min_workspace));
    auto bad = index_typed(dyn_descs(c.bad_inputs, DataType::kFLOAT), c);
    const size_t before = g_logger.lines.size();
    check(build->configurePlugin(bad.data(), static_cast<int32_t>(bad.size()), out.data(), nout) != 0,
          op + ": configurePlugin rejects bad shapes");
    check(g_logger.lines.size() == before + 1 && g_logger.lines.back().find(op) != std::string::npos,
          op + ": one log line naming the op for bad shapes");
    auto rin = index_typed(descs(c.inputs, DataType::kFLOAT), c), rout = descs(c.outputs, DataType::kFLOAT);
    check(runtime->onShapeChange(rin.data(), static_cast<int32_t>(rin.size()), rout.data(), nout) == 0,
          op + ": onShapeChange with good shapes");
    auto rbad = index_typed(descs(c.bad_inputs, DataType::kFLOAT), c);
    check(runtime->onShapeChange(rbad.data(), static_cast<int32_t>(rbad.size()), rout.data(), nout) != 0,
          op + ": onShapeChange rejects bad shapes");
  }

  // Serialization round trip and clone.
  const std::string serialized = fields_text(runtime->getFieldsToSerialize());
  {
    const PluginFieldCollection* sf = runtime->getFieldsToSerialize();
    std::unique_ptr<IPluginV3> back(creator->createPlugin("node0", sf, TensorRTPhase::kRUNTIME));
    check(back != nullptr, op + ": createPlugin(kRUNTIME) from getFieldsToSerialize");
    if (back) {
      auto* brt = cap<IPluginV3OneRuntime>(back.get(), PluginCapabilityType::kRUNTIME);
      check(fields_text(brt->getFieldsToSerialize()) == serialized, op + ": serialization round trip: " + serialized);
      BuilderImpl impl;
      std::vector<DimsExprs> out;
      const IDimensionExpr* sym = nullptr;
      auto* bb = cap<IPluginV3OneBuild>(back.get(), PluginCapabilityType::kBUILD);
      const bool ok = output_shapes(bb, c, false, &out, &sym, &impl);
      check(ok && out[0].d[2]->getConstantValue() == c.outputs[0][2], op + ": deserialized plugin's shapes");
    }
    std::unique_ptr<IPluginV3> copy(plugin->clone());
    check(copy != nullptr, op + ": clone");
    if (copy) {
      auto* ccore = cap<IPluginV3OneCore>(copy.get(), PluginCapabilityType::kCORE);
      auto* crt = cap<IPluginV3OneRuntime>(copy.get(), PluginCapabilityType::kRUNTIME);
      check(std::string(ccore->getPluginName()) == op && fields_text(crt->getFieldsToSerialize()) == serialized,
            op + ": clone keeps name and fields");
    }
  }
  // Every field the parser would pass appears in the serialization with its value.
  for (const Field& f : c.fields) {
    check(serialized.find(f.name + ":") != std::string::npos, op + ": field " + f.name + " is serialized");
  }

  // Bad fields: nullptr and one log line naming the op and the field.
  for (const BadFields& bad : c.bad_fields) {
    std::vector<Field> fields = c.fields;
    for (const Field& b : bad.fields) {
      bool replaced = false;
      for (Field& f : fields)
        if (f.name == b.name) {
          f = b;
          replaced = true;
        }
      if (!replaced) fields.push_back(b);
    }
    Collection bfc(fields);
    const size_t before = g_logger.lines.size();
    std::unique_ptr<IPluginV3> p(creator->createPlugin("bad", &bfc.fc, TensorRTPhase::kBUILD));
    const bool one_line = g_logger.lines.size() == before + 1;
    const std::string line = one_line ? g_logger.lines.back() : "";
    check(p == nullptr && one_line && line.find(op) != std::string::npos && line.find(bad.field) != std::string::npos,
          op + ": bad field " + bad.field + " -> nullptr and one line naming it (got: " + line + ")");
  }

  // Absent fields take the defaults: a plugin from no fields but the required ones exists and serializes
  // every field; without a required field there is no plugin.
  Collection minimal(c.required);
  std::unique_ptr<IPluginV3> defaults(creator->createPlugin("defaults", &minimal.fc, TensorRTPhase::kBUILD));
  check(defaults != nullptr, op + ": createPlugin with only the required fields (defaults)");
  if (!c.required.empty()) {
    PluginFieldCollection none{};
    std::unique_ptr<IPluginV3> p(creator->createPlugin("none", &none, TensorRTPhase::kBUILD));
    check(p == nullptr && g_logger.lines.back().find(c.required[0].name) != std::string::npos,
          op + ": createPlugin without " + c.required[0].name + " fails naming it");
  }
  if (defaults) {
    const PluginFieldCollection* df =
        cap<IPluginV3OneRuntime>(defaults.get(), PluginCapabilityType::kRUNTIME)->getFieldsToSerialize();
    check(df != nullptr && df->nbFields == static_cast<int32_t>(c.declared.size()), op + ": defaults serialize");
  }
}

std::vector<IPluginCreatorV3One*> g_creators;

IPluginCreatorV3One* creator_named(const char* name) {
  for (IPluginCreatorV3One* c : g_creators)
    if (std::strcmp(c->getPluginName(), name) == 0) return c;
  return nullptr;
}

#include "tensorrt_runtime_checks.h"
#include "tensorrt_registry_checks.h"

// loadLibrary-style loading through the fake registry: nothing of the library may call the registry while
// TensorRT's loader runs it (dlopen, setLoggerFinder, getCreators), and getCreators never touches a registry.
void check_registry_loading(const char* lib_path, const char* nvinfer_path, int32_t expected) {
  void* nvinfer = dlopen(nvinfer_path, RTLD_NOW | RTLD_GLOBAL);
  check(nvinfer != nullptr, std::string("load the fake libnvinfer: ") + (nvinfer ? "" : dlerror()));
  if (nvinfer == nullptr) return;
  auto registry = reinterpret_cast<IPluginRegistry* (*)()>(dlsym(nvinfer, "getPluginRegistry"))();
  auto reentries = reinterpret_cast<const char* (*)()>(dlsym(nvinfer, "fake_reentries"));
  auto calls = reinterpret_cast<int (*)()>(dlsym(nvinfer, "fake_registry_calls"));
  const IPluginRegistry::PluginLibraryHandle handle = registry->loadLibrary(lib_path);
  check(handle != nullptr, "IPluginRegistry::loadLibrary-style loading succeeds");
  check(std::string(reentries()).empty(),
        std::string("no registry call from inside dlopen / setLoggerFinder / getCreators (got: ") + reentries() + ")");
  int32_t n = 0;
  registry->getAllCreators(&n);
  check(n == expected, "the loader registered " + std::to_string(expected) + " creators (got " + std::to_string(n) + ")");
  const int before = calls();
  auto get_creators = reinterpret_cast<IPluginCreatorInterface* const* (*)(int32_t&)>(dlsym(handle, "getCreators"));
  int32_t again = 0;
  get_creators(again);
  int32_t still = 0;
  registry->getAllCreators(&still);
  check(calls() == before && still == n && again == n, "getCreators touches no registry and takes nothing back");
}

}  // namespace

// The cuBLAS seam (see tensorrt_runtime_checks.h): distinct fake handles, never dereferenced.
extern "C" {
struct cublasContext;
__attribute__((visibility("default"))) int cublasCreate_v2(cublasContext** handle) {
  static char handles[64];
  *handle = reinterpret_cast<cublasContext*>(&handles[g_blas_created.size() % 64]);
  g_blas_created.push_back(*handle);
  return 0;
}
__attribute__((visibility("default"))) int cublasDestroy_v2(cublasContext* handle) {
  g_blas_destroyed.push_back(handle);
  return 0;
}
}

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s libdcnkit_trt.so\n", argv[0]);
    return 2;
  }
  const std::vector<Case> expected = cases();
  size_t listed = 0;  // the creators of getCreators (TensorRT's own plugin names are not)
  for (const Case& c : expected) listed += c.tensorrt_own_name ? 0 : 1;
  if (argc > 3 && std::string(argv[2]) == "--nvinfer") {
    check_registry_loading(argv[1], argv[3], static_cast<int32_t>(listed));
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 2;
  }
  using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
  using SetLoggerFinder = void (*)(ILoggerFinder*);
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
  auto set_finder = reinterpret_cast<SetLoggerFinder>(dlsym(lib, "setLoggerFinder"));
  check(get_creators != nullptr && set_finder != nullptr, "library exports getCreators and setLoggerFinder");
  if (!get_creators || !set_finder) return 1;
  TestFinder finder;
  finder.logger = &g_logger;
  set_finder(&finder);

  int32_t n = 0;
  IPluginCreatorInterface* const* list = get_creators(n);
  if (argc > 2 && std::string(argv[2]) == "--expect-refusal") {
    check(n == 0, "getCreators offers no creator to a TensorRT the library does not serve (got " +
                      std::to_string(n) + ")");
    check(g_logger.lines.empty(), "nothing is called on the host's logger of a release the library does not serve");
    std::printf("%d passed, %d failed\n", g_passed, g_failed);
    return g_failed == 0 ? 0 : 1;
  }
  if (argc > 2 && std::string(argv[2]) == "--list") {
    // One line per creator: name, version, namespace, then field:type:length (types as PluginFieldType).
    for (int32_t i = 0; i < n; ++i) {
      if (std::strcmp(list[i]->getInterfaceInfo().kind, "PLUGIN CREATOR_V3ONE") != 0) continue;
      auto* cr = static_cast<IPluginCreatorV3One*>(list[i]);
      std::printf("%s\t%s\t%s\t", cr->getPluginName(), cr->getPluginVersion(), cr->getPluginNamespace());
      const PluginFieldCollection* f = cr->getFieldNames();
      for (int32_t j = 0; f && j < f->nbFields; ++j)
        std::printf("%s%s:%d:%d", j ? "," : "", f->fields[j].name, static_cast<int>(f->fields[j].type), f->fields[j].length);
      std::printf("\n");
    }
    return 0;
  }
  check(n == static_cast<int32_t>(listed),
        "getCreators returns " + std::to_string(listed) + " creators (got " + std::to_string(n) + ")");
  // Every creator, TensorRT's own plugin names included, through dcnkit_trt_register_creators.
  auto reg = reinterpret_cast<RegisterCreators>(dlsym(lib, "dcnkit_trt_register_creators"));
  check(reg != nullptr, "library exports dcnkit_trt_register_creators");
  if (!reg) return 1;
  TestRegistry registry;
  check_registered(reg, &registry, expected.size(), "an empty registry");
  for (const Case& c : expected) {
    IPluginCreatorV3One* found = nullptr;
    if (c.tensorrt_own_name) {
      found = static_cast<IPluginCreatorV3One*>(registry.getCreator(c.name, "1", c.ns));
    }
    for (int32_t i = 0; i < n && !c.tensorrt_own_name; ++i) {
      const InterfaceInfo info = list[i]->getInterfaceInfo();
      if (std::strcmp(info.kind, "PLUGIN CREATOR_V3ONE") != 0) continue;
      auto* cr = static_cast<IPluginCreatorV3One*>(list[i]);
      if (std::string(cr->getPluginName()) == c.name && std::string(cr->getPluginNamespace()) == c.ns &&
          std::string(cr->getPluginVersion()) == "1") {
        found = cr;
      }
    }
    check(found != nullptr, std::string("creator ") + c.name + " version 1 namespace '" + c.ns + "'");
    if (found) {
      g_creators.push_back(found);
      run_case(found, c);
    }
  }
  if (g_creators.size() == expected.size()) {
    for (const Case& c : expected) check_roi_types(creator_named(c.name), c);
    check_workspace(creator_named("DeformConv2d"), creator_named("DeformPSRoIPool"), expected);
    check_shared_blas(creator_named("DeformConv2d"), creator_named("MMCVModulatedDeformConv2d"),
                      creator_named("RoIAlign"), expected);
    check_timing_cache_ids(&creator_named, expected);
    check_index_tables(&creator_named, expected);
    check_ignored_fields(&creator_named, expected);
    check_tensorrt_own_names(reg, list, n, expected);
  }
  std::printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}
