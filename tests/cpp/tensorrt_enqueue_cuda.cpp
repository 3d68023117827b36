// The CUDA mode of the host lifecycle harness (issue 25 item 7): every case of a manifest written by
// scripts/check_trt_enqueue.py goes through the plugin's lifecycle as TensorRT drives it, without TensorRT's
// libraries -- createPlugin(kBUILD) from the parser's fields, getOutputShapes (checked against the manifest's
// output dims), configurePlugin, getWorkspaceSize, then the runtime side: createPlugin(kRUNTIME) from
// getFieldsToSerialize, attachToContext (the library takes a real cuBLAS handle), onShapeChange and enqueue on
// a CUDA stream over cudaMalloc'ed buffers; then the build-phase instance enqueued unattached (as TensorRT times a
// plugin while it builds), which must give the same bits. The inputs come from raw files; the outputs are written
// back to raw files, which the Python side compares with the torch op. Build: g++ -std=c++17 with TensorRT's and CUDA's
// headers, -lcudart -ldl.
//
// Usage: tensorrt_enqueue_cuda libdcnkit_trt.so manifest.txt [--plan]
//   --plan: the host half only (no CUDA call: machines without a GPU check the manifest against the plugins).
// Manifest, one item per line, whitespace separated (a case ends with "end"):
//   case <label> <plugin name> <namespace, "-" for "">
//   field <name> i32|f32 <count> <values...>      |  field <name> str <text>
//   in <raw file> <dtype> <rank> <dims...>          (node input order)
//   out <raw file> <dtype> <rank> <dims...>
//   end
// dtypes: float32 float16 bfloat16 int32 int64. Prints "ok <label>" or "FAILED <label>: <why>" per case, then
// "N passed, M failed"; exit 0 when all passed, 1 on a failure, 2 on bad usage, 3 when no CUDA device is usable.
#include <NvInferRuntime.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

#include "tensorrt_test_support.h"

struct TensorSpec {
  std::string path;
  DataType type = DataType::kFLOAT;
  std::vector<int64_t> dims;
  size_t bytes() const {
    size_t n = type == DataType::kINT64 ? 8 : (type == DataType::kHALF || type == DataType::kBF16) ? 2 : 4;
    for (int64_t d : dims) n *= static_cast<size_t>(d);
    return n;
  }
};

struct Manifest {
  std::string label, plugin, ns;
  std::vector<Field> fields;
  std::vector<TensorSpec> in, out;
};

bool parse_type(const std::string& s, DataType* t) {
  const std::pair<const char*, DataType> names[] = {{"float32", DataType::kFLOAT}, {"float16", DataType::kHALF},
                                                    {"bfloat16", DataType::kBF16}, {"int32", DataType::kINT32},
                                                    {"int64", DataType::kINT64}};
  for (const auto& n : names)
    if (s == n.first) {
      *t = n.second;
      return true;
    }
  return false;
}

bool read_manifest(const char* path, std::vector<Manifest>* cases, std::string* why) {
  std::ifstream f(path);
  if (!f) {
    *why = std::string("cannot read ") + path;
    return false;
  }
  std::string line;
  Manifest* c = nullptr;
  for (int no = 1; std::getline(f, line); ++no) {
    std::istringstream s(line);
    std::string kind;
    if (!(s >> kind)) continue;
    const std::string at = std::string(path) + ":" + std::to_string(no) + ": ";
    if (kind == "case") {
      cases->emplace_back();
      c = &cases->back();
      s >> c->label >> c->plugin >> c->ns;
      if (c->ns == "-") c->ns.clear();
    } else if (c == nullptr) {
      *why = at + "expected 'case' first, got '" + kind + "'";
      return false;
    } else if (kind == "field") {
      std::string name, type;
      s >> name >> type;
      Field fl{name, PluginFieldType::kINT32, {}, {}, ""};
      size_t n = 0;
      if (type == "str") {
        fl.type = PluginFieldType::kCHAR;
        s >> fl.s;
      } else if (type == "i32" && (s >> n)) {
        fl.ints.resize(n);
        for (int32_t& v : fl.ints) s >> v;
      } else if (type == "f32" && (s >> n)) {
        fl.type = PluginFieldType::kFLOAT32;
        fl.floats.resize(n);
        for (float& v : fl.floats) s >> v;
      } else {
        *why = at + "field type: expected i32, f32 or str, got '" + type + "'";
        return false;
      }
      c->fields.push_back(fl);
    } else if (kind == "in" || kind == "out") {
      TensorSpec t;
      std::string type;
      size_t rank = 0;
      s >> t.path >> type >> rank;
      t.dims.resize(rank);
      for (int64_t& d : t.dims) s >> d;
      if (!parse_type(type, &t.type)) {
        *why = at + "dtype: expected float32, float16, bfloat16, int32 or int64, got '" + type + "'";
        return false;
      }
      (kind == "in" ? c->in : c->out).push_back(t);
    } else if (kind != "end") {
      *why = at + "expected case, field, in, out or end, got '" + kind + "'";
      return false;
    }
    if (!s && kind != "end") {
      *why = at + "too few values";
      return false;
    }
  }
  return true;
}

std::vector<PluginTensorDesc> descs(const std::vector<TensorSpec>& ts) {
  std::vector<PluginTensorDesc> d(ts.size());
  for (size_t i = 0; i < ts.size(); ++i) {
    d[i].dims = dims_of(ts[i].dims);
    d[i].type = ts[i].type;
    d[i].format = TensorFormat::kLINEAR;
    d[i].scale = 1.f;
  }
  return d;
}

std::vector<DynamicPluginTensorDesc> dyn_descs(const std::vector<TensorSpec>& ts) {
  std::vector<DynamicPluginTensorDesc> d(ts.size());
  const std::vector<PluginTensorDesc> p = descs(ts);
  for (size_t i = 0; i < ts.size(); ++i) {
    d[i].desc = p[i];
    d[i].min = d[i].opt = d[i].max = p[i].dims;
  }
  return d;
}

// Device buffers freed on every path.
struct DeviceBuffers {
  std::vector<void*> p;
  ~DeviceBuffers() {
    for (void* x : p) cudaFree(x);
  }
  void* alloc(size_t bytes, std::string* why) {
    void* x = nullptr;
    const cudaError_t e = cudaMalloc(&x, bytes > 0 ? bytes : 1);
    if (e != cudaSuccess) {
      *why = std::string("cudaMalloc: ") + cudaGetErrorString(e);
      return nullptr;
    }
    p.push_back(x);
    return x;
  }
};

std::string cuda_error(const char* what, cudaError_t e) {
  return e == cudaSuccess ? "" : std::string(what) + ": " + cudaGetErrorString(e);
}

// The build side: plugin from the fields, output shapes against the manifest, configurePlugin, workspace.
std::string build_side(IPluginCreatorV3One* creator, const Manifest& m, size_t* workspace) {
  Collection fc(m.fields);
  std::unique_ptr<IPluginV3> plugin(creator->createPlugin(m.label.c_str(), &fc.fc, TensorRTPhase::kBUILD));
  auto* build = plugin ? cap<IPluginV3OneBuild>(plugin.get(), PluginCapabilityType::kBUILD) : nullptr;
  if (build == nullptr) return "createPlugin(kBUILD) refused the fields (see the log line above)";
  const auto nin = static_cast<int32_t>(m.in.size()), nout = static_cast<int32_t>(m.out.size());
  if (build->getNbOutputs() != nout) return "getNbOutputs " + std::to_string(build->getNbOutputs());
  BuilderImpl impl;
  Builder builder(&impl);
  std::vector<DimsExprs> in(m.in.size()), out(m.out.size());
  for (size_t i = 0; i < m.in.size(); ++i) {
    in[i].nbDims = static_cast<int32_t>(m.in[i].dims.size());
    for (size_t d = 0; d < m.in[i].dims.size(); ++d) in[i].d[d] = impl.constant(m.in[i].dims[d]);
  }
  if (build->getOutputShapes(in.data(), nin, nullptr, 0, out.data(), nout, builder) != 0) return "getOutputShapes";
  for (int32_t o = 0; o < nout; ++o) {
    bool same = out[o].nbDims == static_cast<int32_t>(m.out[o].dims.size());
    for (int32_t d = 0; same && d < out[o].nbDims; ++d)
      same = out[o].d[d]->isConstant() && out[o].d[d]->getConstantValue() == m.out[o].dims[d];
    if (!same) return "output " + std::to_string(o) + ": the plugin's shape differs from the manifest's";
  }
  auto din = dyn_descs(m.in), dout = dyn_descs(m.out);
  for (int32_t pos = 0; pos < nin + nout; ++pos) {
    std::vector<DynamicPluginTensorDesc> all = din;
    all.insert(all.end(), dout.begin(), dout.end());
    if (!build->supportsFormatCombination(pos, all.data(), nin, nout))
      return "supportsFormatCombination refuses position " + std::to_string(pos);
  }
  if (build->configurePlugin(din.data(), nin, dout.data(), nout) != 0) return "configurePlugin";
  *workspace = build->getWorkspaceSize(din.data(), nin, dout.data(), nout);
  return "";
}

bool read_file(const TensorSpec& t, std::vector<char>* data, std::string* why) {
  std::ifstream f(t.path, std::ios::binary);
  data->assign(t.bytes(), 0);
  if (!f.read(data->data(), static_cast<std::streamsize>(data->size()))) {
    *why = t.path + ": expected " + std::to_string(t.bytes()) + " bytes";
    return false;
  }
  return true;
}

// onShapeChange and enqueue of runtime instance `p` on a CUDA stream over cudaMalloc'ed buffers (the inputs from
// their raw files, the outputs preset to NaN), then the outputs back to the host.
std::string enqueue_on_device(IPluginV3* p, const Manifest& m, size_t workspace, std::vector<std::vector<char>>* got) {
  auto* rt = cap<IPluginV3OneRuntime>(p, PluginCapabilityType::kRUNTIME);
  auto in = descs(m.in), out = descs(m.out);
  const auto nin = static_cast<int32_t>(m.in.size()), nout = static_cast<int32_t>(m.out.size());
  if (rt->onShapeChange(in.data(), nin, out.data(), nout) != 0) return "onShapeChange";

  std::string why;
  DeviceBuffers buf;
  std::vector<const void*> ins;
  std::vector<void*> outs;
  for (const TensorSpec& t : m.in) {
    std::vector<char> host;
    void* d = read_file(t, &host, &why) ? buf.alloc(t.bytes(), &why) : nullptr;
    if (d == nullptr) return why;
    why = cuda_error("cudaMemcpy in", cudaMemcpy(d, host.data(), host.size(), cudaMemcpyHostToDevice));
    if (!why.empty()) return why;
    ins.push_back(d);
  }
  for (const TensorSpec& t : m.out) {
    void* d = buf.alloc(t.bytes(), &why);
    if (d == nullptr) return why;
    why = cuda_error("cudaMemset", cudaMemset(d, 0xff, t.bytes()));  // NaN everywhere a plugin does not write
    if (!why.empty()) return why;
    outs.push_back(d);
  }
  void* ws = workspace > 0 ? buf.alloc(workspace, &why) : nullptr;
  if (workspace > 0 && ws == nullptr) return why;
  cudaStream_t stream = nullptr;
  why = cuda_error("cudaStreamCreate", cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  if (!why.empty()) return why;
  const int32_t rc = rt->enqueue(in.data(), out.data(), ins.data(), outs.data(), ws, stream);
  why = cuda_error("the stream after enqueue", cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  if (rc != 0) return "enqueue returned " + std::to_string(rc) + " (see the log line above)";
  if (!why.empty()) return why;
  got->assign(m.out.size(), {});
  for (size_t o = 0; o < m.out.size(); ++o) {
    (*got)[o].resize(m.out[o].bytes());
    why = cuda_error("cudaMemcpy out", cudaMemcpy((*got)[o].data(), outs[o], m.out[o].bytes(), cudaMemcpyDeviceToHost));
    if (!why.empty()) return why;
  }
  return "";
}

// The runtime side on the device: what a deserialized engine does per call (createPlugin(kRUNTIME) from
// getFieldsToSerialize, attachToContext, onShapeChange, enqueue), the outputs written to their raw files; then what
// TensorRT does when it times a plugin while it builds: the build-phase instance enqueued without attachToContext
// (DeformConv2d then takes a cuBLAS handle of its own), whose outputs must equal the attached instance's bit for bit.
std::string device_side(IPluginCreatorV3One* creator, const Manifest& m, size_t workspace) {
  Collection fc(m.fields);
  std::unique_ptr<IPluginV3> built(creator->createPlugin(m.label.c_str(), &fc.fc, TensorRTPhase::kBUILD));
  const PluginFieldCollection* saved =
      cap<IPluginV3OneRuntime>(built.get(), PluginCapabilityType::kRUNTIME)->getFieldsToSerialize();
  std::unique_ptr<IPluginV3> loaded(creator->createPlugin(m.label.c_str(), saved, TensorRTPhase::kRUNTIME));
  if (!loaded) return "createPlugin(kRUNTIME) from getFieldsToSerialize";
  TestResourceContext context;
  std::unique_ptr<IPluginV3> attached(
      cap<IPluginV3OneRuntime>(loaded.get(), PluginCapabilityType::kRUNTIME)->attachToContext(&context));
  if (!attached) return "attachToContext";
  std::vector<std::vector<char>> got, unattached;
  std::string why = enqueue_on_device(attached.get(), m, workspace, &got);
  if (!why.empty()) return why;
  for (size_t o = 0; o < m.out.size(); ++o) {
    std::ofstream f(m.out[o].path, std::ios::binary);
    if (!f.write(got[o].data(), static_cast<std::streamsize>(got[o].size()))) return "cannot write " + m.out[o].path;
  }
  why = enqueue_on_device(built.get(), m, workspace, &unattached);
  if (!why.empty()) return "unattached (build-phase) instance: " + why;
  for (size_t o = 0; o < m.out.size(); ++o) {
    if (unattached[o] != got[o]) return "unattached (build-phase) instance: output " + std::to_string(o) + " differs";
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s libdcnkit_trt.so manifest.txt [--plan]\n", argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each case's line survives a crash in a later case
  const bool plan = argc > 3 && std::string(argv[3]) == "--plan";
  std::vector<Manifest> cases;
  std::string why;
  if (!read_manifest(argv[2], &cases, &why)) {
    std::fprintf(stderr, "%s\n", why.c_str());
    return 2;
  }
  if (!plan) {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
      std::printf("no CUDA device: %s\n", e != cudaSuccess ? cudaGetErrorString(e) : "none found");
      return 3;
    }
  }
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::fprintf(stderr, "dlopen failed: %s\n", dlerror());
    return 2;
  }
  using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
  auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
  auto set_finder = reinterpret_cast<void (*)(ILoggerFinder*)>(dlsym(lib, "setLoggerFinder"));
  if (get_creators == nullptr || set_finder == nullptr) {
    std::fprintf(stderr, "%s exports no getCreators / setLoggerFinder\n", argv[1]);
    return 2;
  }
  TestFinder finder;
  finder.logger = &g_logger;
  set_finder(&finder);
  int32_t n = 0;
  IPluginCreatorInterface* const* list = get_creators(n);
  int passed = 0, failed = 0;
  for (const Manifest& m : cases) {
    IPluginCreatorV3One* creator = nullptr;
    for (int32_t i = 0; i < n; ++i) {
      auto* c = static_cast<IPluginCreatorV3One*>(list[i]);
      if (m.plugin == c->getPluginName() && m.ns == c->getPluginNamespace()) creator = c;
    }
    const size_t log_before = g_logger.lines.size();
    size_t workspace = 0;
    std::string err = creator == nullptr ? "no creator " + m.plugin + " in namespace '" + m.ns + "'"
                                         : build_side(creator, m, &workspace);
    if (err.empty() && !plan) err = device_side(creator, m, workspace);
    for (size_t i = log_before; !err.empty() && i < g_logger.lines.size(); ++i) err += "; log: " + g_logger.lines[i];
    if (err.empty()) {
      ++passed;
      std::printf("ok %s (workspace %zu bytes)\n", m.label.c_str(), workspace);
    } else {
      ++failed;
      std::printf("FAILED %s: %s\n", m.label.c_str(), err.c_str());
    }
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
