// dcnkit_ort_run: runs an ONNX model that uses the kit's custom ops through the ONNX Runtime C++ API.
//
//   dcnkit_ort_run --model m.onnx --library libdcnkit_ort.so [--input NAME=FILE.npy]... [--dim SYM=VALUE]...
//                  [--seed 0] [--threads 2] [--cuda] [--output-dir DIR]
//
// Inputs come from .npy files (float32, float16 as raw bits, int64, int32; C order) or, when not given,
// from uniform random numbers in [-1, 1) drawn with a fixed seed (symbolic dimensions default to 1 and
// are set with --dim). Prints every output's shape and checksums (sum, sum of absolute values) and
// optionally writes the outputs as .npy files.
//
// It asks ONNX Runtime for C API 16 (ONNX Runtime 1.16.0) and uses nothing newer, so one build runs against any
// libonnxruntime.so.1 from 1.16 on (ORT_API_MANUAL_INIT: the C++ API is bound to that table in main).
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

constexpr uint32_t kApiFloor = 16;  // ONNX Runtime 1.16.0

struct Array {
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  std::vector<int64_t> shape;
  std::vector<char> bytes;
};

size_t elem_size(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return 4;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return 8;
    default: throw std::runtime_error("unsupported element type " + std::to_string(static_cast<int>(t)));
  }
}

const char* npy_descr(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return "<f4";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return "<f2";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return "<i8";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return "<i4";
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return "<f8";
    default: throw std::runtime_error("unsupported element type");
  }
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

// Minimal .npy (version 1/2/3) reader: little-endian, C order.
Array read_npy(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot open " + path);
  char magic[6];
  f.read(magic, 6);
  if (!f || std::memcmp(magic, "\x93NUMPY", 6) != 0) throw std::runtime_error(path + ": not a .npy file");
  unsigned char ver[2];
  f.read(reinterpret_cast<char*>(ver), 2);
  uint32_t hlen = 0;
  if (ver[0] == 1) {
    unsigned char b[2];
    f.read(reinterpret_cast<char*>(b), 2);
    hlen = b[0] | (b[1] << 8);
  } else {
    unsigned char b[4];
    f.read(reinterpret_cast<char*>(b), 4);
    hlen = b[0] | (b[1] << 8) | (b[2] << 16) | (static_cast<uint32_t>(b[3]) << 24);
  }
  std::string header(hlen, '\0');
  f.read(header.data(), hlen);
  Array a;
  auto field = [&](const char* key) -> std::string {
    const size_t k = header.find(key);
    if (k == std::string::npos) throw std::runtime_error(path + ": header lacks " + key);
    return header.substr(k + std::strlen(key));
  };
  const std::string descr = field("'descr':");
  const size_t q1 = descr.find('\''), q2 = descr.find('\'', q1 + 1);
  const std::string d = descr.substr(q1 + 1, q2 - q1 - 1);
  if (d == "<f4") a.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  else if (d == "<f2") a.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
  else if (d == "<i8") a.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64;
  else if (d == "<i4") a.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  else if (d == "<f8") a.type = ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE;
  else throw std::runtime_error(path + ": unsupported dtype " + d);
  if (field("'fortran_order':").find("True") < 3) throw std::runtime_error(path + ": Fortran order not supported");
  const std::string sh = field("'shape':");
  const size_t p1 = sh.find('('), p2 = sh.find(')');
  std::stringstream ss(sh.substr(p1 + 1, p2 - p1 - 1));
  std::string tok;
  while (std::getline(ss, tok, ',')) {
    if (tok.find_first_of("0123456789") == std::string::npos) continue;
    a.shape.push_back(std::stoll(tok));
  }
  a.bytes.resize(static_cast<size_t>(numel(a.shape)) * elem_size(a.type));
  f.read(a.bytes.data(), static_cast<std::streamsize>(a.bytes.size()));
  if (!f) throw std::runtime_error(path + ": truncated data");
  return a;
}

void write_npy(const std::string& path, ONNXTensorElementDataType t, const std::vector<int64_t>& shape,
               const void* data) {
  std::ostringstream h;
  h << "{'descr': '" << npy_descr(t) << "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < shape.size(); ++i) h << shape[i] << (shape.size() == 1 || i + 1 < shape.size() ? "," : "");
  h << "), }";
  std::string header = h.str();
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char lb[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(lb, 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(numel(shape) * elem_size(t)));
  if (!f) throw std::runtime_error("cannot write " + path);
}

float half_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  float v;
  if (exp == 0) v = std::ldexp(static_cast<float>(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(static_cast<float>(man | 0x400), static_cast<int>(exp) - 25);
  return sign ? -v : v;
}

double element(const void* p, ONNXTensorElementDataType t, int64_t i) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return static_cast<const float*>(p)[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return half_to_float(static_cast<const uint16_t*>(p)[i]);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32: return static_cast<const int32_t*>(p)[i];
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: return static_cast<const double*>(p)[i];
    default: return 0.0;
  }
}

uint16_t float_to_half(float f) {  // round to nearest even, for random inputs only
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffffu;
  if (exp <= 0) return static_cast<uint16_t>(sign);
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (man >> 13);
  const uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}

void usage() {
  std::cerr << "usage: dcnkit_ort_run --model MODEL.onnx --library LIB.so [--input NAME=FILE.npy]... "
               "[--dim SYMBOL=VALUE]... [--seed N] [--threads N] [--cuda] [--output-dir DIR]\n";
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, library, output_dir;
  std::map<std::string, std::string> input_files;
  std::map<std::string, int64_t> dims;
  unsigned seed = 0;
  int threads = 0;
  bool cuda = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    try {
      if (a == "--model") model = next();
      else if (a == "--library") library = next();
      else if (a == "--output-dir") output_dir = next();
      else if (a == "--seed") seed = static_cast<unsigned>(std::stoul(next()));
      else if (a == "--threads") threads = std::stoi(next());
      else if (a == "--cuda") cuda = true;
      else if (a == "--input" || a == "--dim") {
        const std::string kv = next();
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) throw std::runtime_error(a + ": expected NAME=VALUE, got " + kv);
        if (a == "--input") input_files[kv.substr(0, eq)] = kv.substr(eq + 1);
        else dims[kv.substr(0, eq)] = std::stoll(kv.substr(eq + 1));
      } else if (a == "-h" || a == "--help") {
        usage();
        return 0;
      } else {
        throw std::runtime_error("unknown argument " + a);
      }
    } catch (const std::exception& e) {
      std::cerr << "dcnkit_ort_run: " << e.what() << "\n";
      usage();
      return 2;
    }
  }
  if (model.empty()) {
    usage();
    return 2;
  }

  const OrtApiBase* base = OrtGetApiBase();
  const char* found = base->GetVersionString();
  int major = 0, minor = 0;
  if (std::sscanf(found, "%d.%d", &major, &minor) != 2 || (major == 1 && minor < static_cast<int>(kApiFloor))) {
    std::cerr << "dcnkit_ort_run: needs ONNX Runtime >= 1." << kApiFloor << ".0; found ONNX Runtime " << found << "\n";
    return 1;
  }
  Ort::InitApi(base->GetApi(kApiFloor));
  try {
    Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "dcnkit_ort_run");
    Ort::SessionOptions so;
    if (threads > 0) so.SetIntraOpNumThreads(threads);
    if (!library.empty()) so.RegisterCustomOpsLibrary(library.c_str());
    if (cuda) {
      OrtCUDAProviderOptions cuda_options{};
      so.AppendExecutionProvider_CUDA(cuda_options);
    }
    Ort::Session session(env, model.c_str(), so);
    Ort::AllocatorWithDefaultOptions alloc;
    Ort::MemoryInfo mem = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);

    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    std::vector<Array> arrays;
    std::vector<std::string> in_names, out_names;
    std::vector<Ort::Value> inputs;
    const size_t n_in = session.GetInputCount();
    arrays.reserve(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      const std::string name = session.GetInputNameAllocated(i, alloc).get();
      in_names.push_back(name);
      Ort::TypeInfo ti = session.GetInputTypeInfo(i);
      auto tinfo = ti.GetTensorTypeAndShapeInfo();
      Array arr;
      auto it = input_files.find(name);
      const bool from_file = it != input_files.end();
      if (from_file) {
        arr = read_npy(it->second);
        input_files.erase(it);
      } else {
        arr.type = tinfo.GetElementType();
        std::vector<int64_t> shape = tinfo.GetShape();
        std::vector<const char*> syms(shape.size());
        tinfo.GetSymbolicDimensions(syms.data(), syms.size());
        for (size_t d = 0; d < shape.size(); ++d) {
          if (shape[d] >= 0) continue;
          auto dv = (syms[d] && *syms[d]) ? dims.find(syms[d]) : dims.end();
          shape[d] = dv != dims.end() ? dv->second : 1;
        }
        arr.shape = shape;
        const int64_t n = numel(shape);
        arr.bytes.resize(static_cast<size_t>(n) * elem_size(arr.type));
        for (int64_t k = 0; k < n; ++k) {
          const float v = uni(rng);
          switch (arr.type) {
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: reinterpret_cast<float*>(arr.bytes.data())[k] = v; break;
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
              reinterpret_cast<uint16_t*>(arr.bytes.data())[k] = float_to_half(v);
              break;
            case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE: reinterpret_cast<double*>(arr.bytes.data())[k] = v; break;
            default: throw std::runtime_error("input " + name + ": random data only for floating inputs");
          }
        }
      }
      arrays.push_back(std::move(arr));
      Array& a = arrays.back();
      inputs.push_back(Ort::Value::CreateTensor(mem.GetConst(), a.bytes.data(), a.bytes.size(), a.shape.data(),
                                                a.shape.size(), a.type));
      std::cout << "input " << name << " shape " << shape_str(a.shape) << (from_file ? " (file)" : " (random)")
                << "\n";
    }
    if (!input_files.empty()) throw std::runtime_error("--input " + input_files.begin()->first + ": no such model input");
    const size_t n_out = session.GetOutputCount();
    for (size_t i = 0; i < n_out; ++i) out_names.push_back(session.GetOutputNameAllocated(i, alloc).get());
    std::vector<const char*> in_c, out_c;
    for (auto& s : in_names) in_c.push_back(s.c_str());
    for (auto& s : out_names) out_c.push_back(s.c_str());

    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_c.data(), inputs.data(), inputs.size(), out_c.data(),
                               out_c.size());
    std::cout << std::setprecision(10);
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto info = outputs[i].GetTensorTypeAndShapeInfo();
      const auto shape = info.GetShape();
      const auto type = info.GetElementType();
      const void* data = outputs[i].GetTensorRawData();
      double sum = 0, abs_sum = 0;
      const int64_t n = numel(shape);
      for (int64_t k = 0; k < n; ++k) {
        const double v = element(data, type, k);
        sum += v;
        abs_sum += std::fabs(v);
      }
      std::cout << "output " << out_names[i] << " shape " << shape_str(shape) << " sum " << sum << " abs_sum "
                << abs_sum << "\n";
      if (!output_dir.empty()) write_npy(output_dir + "/" + out_names[i] + ".npy", type, shape, data);
    }
  } catch (const std::exception& e) {
    std::cerr << "dcnkit_ort_run: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
