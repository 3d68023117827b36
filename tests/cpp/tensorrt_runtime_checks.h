// Checks of tensorrt_lifecycle_test.cpp beyond the per-creator walk: workspace bounds from inconsistent profile
// maxima and enqueue's refusal of a missing or short workspace, float32 RoIs with 16-bit features, the cuBLAS
// handle shared per execution context, timing-cache IDs, and index tables in int32 or int64. Included once, inside
// that file's namespace, after run_case.
#pragma once

// ---------------------------------------------------------------------------------------------
// cuBLAS seam: the program (linked with -rdynamic) defines cublasCreate_v2 / cublasDestroy_v2, which the
// plugin library's references bind to before libcublas's, so handle creation is observed without a GPU.

std::vector<const void*> g_blas_created, g_blas_destroyed;

const Case* find_case(const std::vector<Case>& cs, const char* name) {
  for (const Case& c : cs)
    if (std::strcmp(c.name, name) == 0) return &c;
  return nullptr;
}

std::unique_ptr<IPluginV3> make(IPluginCreatorV3One* creator, const std::vector<Field>& fields, const char* node) {
  Collection fc(fields);
  return std::unique_ptr<IPluginV3>(creator->createPlugin(node, &fc.fc, TensorRTPhase::kBUILD));
}

// Dynamic descs with separate min/max: `max` per input (min = opt = desc dims = `min`).
std::vector<DynamicPluginTensorDesc> profile(const std::vector<std::vector<int64_t>>& min,
                                             const std::vector<std::vector<int64_t>>& max,
                                             const std::vector<DataType>& types) {
  std::vector<DynamicPluginTensorDesc> d = dyn_descs(min, DataType::kFLOAT);
  for (size_t i = 0; i < d.size(); ++i) {
    d[i].max = dims_of(max[i]);
    d[i].desc.type = types[i];
    d[i].desc.dims.nbDims = static_cast<int32_t>(min[i].size());
    for (auto& x : d[i].desc.dims.d) x = -1;  // dynamic
  }
  return d;
}

bool last_log_has(size_t before, const std::string& a, const std::string& b) {
  return g_logger.lines.size() == before + 1 && g_logger.lines.back().find(a) != std::string::npos &&
         g_logger.lines.back().find(b) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------

void check_workspace(IPluginCreatorV3One* dcn, IPluginCreatorV3One* psroi, const std::vector<Case>& cs) {
  // DeformConv2d 3x3, stride 2, pad 1: a profile whose input maxima (40 x 40) do not fit the offset maxima
  // (9 x 10; a 40 x 40 input gives 20 x 20). Every call of the profile has the offset's (Ho, Wo) <= (9, 10).
  const Case& c = *find_case(cs, "DeformConv2d");
  auto p = make(dcn, c.fields, "ws");
  auto* build = cap<IPluginV3OneBuild>(p.get(), PluginCapabilityType::kBUILD);
  auto* rt = cap<IPluginV3OneRuntime>(p.get(), PluginCapabilityType::kRUNTIME);
  const std::vector<DataType> f32(5, DataType::kFLOAT);
  auto in = profile({{1, 8, 5, 5}, {1, 36, 3, 3}, {16, 8, 3, 3}, {16}, {1, 18, 3, 3}},
                    {{2, 8, 40, 40}, {2, 36, 9, 10}, {16, 8, 3, 3}, {16}, {2, 18, 9, 10}}, f32);
  auto out = dyn_descs({{2, 16, 9, 10}}, DataType::kFLOAT);
  const size_t ws = build->getWorkspaceSize(in.data(), 5, out.data(), 1);
  const size_t one_image = size_t(8) * 9 * 9 * 10 * sizeof(float);  // columns of a (2, 8, 17, 19) call, per image
  check(ws >= one_image, "DeformConv2d: workspace from inconsistent max dims " + std::to_string(ws) + " >= " +
                             std::to_string(one_image));
  // enqueue refuses a call without a workspace, and one that needs more than getWorkspaceSize said.
  auto call = descs({{2, 8, 17, 19}, {2, 36, 9, 10}, {16, 8, 3, 3}, {16}, {2, 18, 9, 10}}, DataType::kFLOAT);
  auto rout = descs({{2, 16, 9, 10}}, DataType::kFLOAT);
  check(rt->onShapeChange(call.data(), 5, rout.data(), 1) == 0, "DeformConv2d: onShapeChange of a profile call");
  const void* ins[5] = {};
  void* outs[1] = {};
  size_t before = g_logger.lines.size();
  check(rt->enqueue(call.data(), rout.data(), ins, outs, nullptr, nullptr) != 0 &&
            last_log_has(before, "workspace", "got none"),
        "DeformConv2d: enqueue without the workspace it needs fails with a log line");
  auto big = descs({{4, 8, 80, 80}, {4, 36, 40, 40}, {16, 8, 3, 3}, {16}, {4, 18, 40, 40}}, DataType::kFLOAT);
  auto big_out = descs({{4, 16, 40, 40}}, DataType::kFLOAT);
  check(rt->onShapeChange(big.data(), 5, big_out.data(), 1) == 0, "DeformConv2d: onShapeChange of a larger call");
  char dummy[16];
  before = g_logger.lines.size();
  check(rt->enqueue(big.data(), big_out.data(), ins, outs, dummy, nullptr) != 0 &&
            last_log_has(before, "workspace", "got " + std::to_string(ws)),
        "DeformConv2d: enqueue refuses a call needing more workspace than getWorkspaceSize returned");

  // DeformPSRoIPool with float32 RoIs and float16 features reads a float32 copy of trans: bounded by the trans
  // maxima (8 RoIs) even where the RoI maxima say 4; none with float32 features.
  const Case& pc = *find_case(cs, "DeformPSRoIPool");
  auto pp = make(psroi, pc.fields, "ws");
  auto* pb = cap<IPluginV3OneBuild>(pp.get(), PluginCapabilityType::kBUILD);
  const std::vector<std::vector<int64_t>> pmin = {{1, 18, 4, 4}, {1, 5}, {1, 2, 3, 3}};
  const std::vector<std::vector<int64_t>> pmax = {{2, 18, 12, 12}, {4, 5}, {8, 2, 3, 3}};
  auto pin = profile(pmin, pmax, {DataType::kHALF, DataType::kFLOAT, DataType::kHALF});
  auto pout = dyn_descs({{4, 2, 3, 3}, {4, 2, 3, 3}}, DataType::kHALF);
  const size_t pws = pb->getWorkspaceSize(pin.data(), 3, pout.data(), 2);
  check(pws >= size_t(8) * 2 * 3 * 3 * sizeof(float),
        "DeformPSRoIPool: float32 trans copy for float32 RoIs, bounded by the trans maxima: " + std::to_string(pws));
  auto pin32 = profile(pmin, pmax, std::vector<DataType>(3, DataType::kFLOAT));
  check(pb->getWorkspaceSize(pin32.data(), 3, pout.data(), 2) == 0, "DeformPSRoIPool: no workspace in float32");
}

// ---------------------------------------------------------------------------------------------

// Every RoI plugin: RoIs in the features' type or in float32, for float32, float16 and bfloat16 features;
// the outputs follow the features; other inputs (offsets, trans, further maps) stay in the features' type.
void check_roi_types(IPluginCreatorV3One* creator, const Case& c) {
  const std::string op = c.name;
  int rois = -1, features = -1;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    if (rois < 0 && c.inputs[i].size() == 2 && c.inputs[i][1] == 5) rois = static_cast<int>(i);
    if (features < 0 && c.inputs[i].size() == 4) features = static_cast<int>(i);
  }
  if (rois < 0) return;  // not a RoI operator
  auto p = make(creator, c.fields, "types");
  auto* build = cap<IPluginV3OneBuild>(p.get(), PluginCapabilityType::kBUILD);
  const auto nin = static_cast<int32_t>(c.inputs.size()), nout = static_cast<int32_t>(c.outputs.size());
  std::vector<std::vector<int64_t>> all = c.inputs;
  all.insert(all.end(), c.outputs.begin(), c.outputs.end());
  const DataType kinds[] = {DataType::kFLOAT, DataType::kHALF, DataType::kBF16};
  for (DataType f : kinds) {
    for (DataType r : kinds) {
      auto d = dyn_descs(all, f);
      d[rois].desc.type = r;
      bool every = true;
      for (int32_t pos = 0; pos < nin + nout; ++pos) every = every && build->supportsFormatCombination(pos, d.data(), nin, nout);
      const bool want = r == f || r == DataType::kFLOAT;
      check(every == want, op + ": features " + std::to_string(static_cast<int>(f)) + " with rois " +
                               std::to_string(static_cast<int>(r)) + (want ? " accepted" : " rejected"));
      if (!want) continue;
      std::vector<DataType> in_types(c.inputs.size(), f), out_types(c.outputs.size(), DataType::kINT8);
      in_types[rois] = r;
      bool follow = build->getOutputDataTypes(out_types.data(), nout, in_types.data(), nin) == 0;
      for (DataType o : out_types) follow = follow && o == f;
      check(follow, op + ": outputs in the features' type " + std::to_string(static_cast<int>(f)) + " with rois " +
                        std::to_string(static_cast<int>(r)));
      // Any other input in float32 next to 16-bit features is refused at its position.
      for (int32_t other = 0; other < nin && f != DataType::kFLOAT; ++other) {
        if (other == rois || other == features) continue;
        auto e = d;
        e[other].desc.type = DataType::kFLOAT;
        check(!build->supportsFormatCombination(other, e.data(), nin, nout),
              op + ": input " + std::to_string(other) + " must be in the features' type");
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------

void check_shared_blas(IPluginCreatorV3One* dcn, IPluginCreatorV3One* mmcv_dcn, IPluginCreatorV3One* roi,
                       const std::vector<Case>& cs) {
  auto a = make(dcn, find_case(cs, "DeformConv2d")->fields, "a");
  auto b = make(mmcv_dcn, find_case(cs, "MMCVModulatedDeformConv2d")->fields, "b");
  auto r = make(roi, find_case(cs, "RoIAlign")->fields, "r");
  auto rt = [](IPluginV3* p) { return cap<IPluginV3OneRuntime>(p, PluginCapabilityType::kRUNTIME); };
  g_blas_created.clear();
  g_blas_destroyed.clear();
  TestResourceContext ctx1, ctx2;
  std::unique_ptr<IPluginV3> a1(rt(a.get())->attachToContext(&ctx1));
  std::unique_ptr<IPluginV3> b1(rt(b.get())->attachToContext(&ctx1));
  std::unique_ptr<IPluginV3> r1(rt(r.get())->attachToContext(&ctx1));
  check(a1 && b1 && r1 && g_blas_created.size() == 1,
        "two DCN layers (and a RoIAlign) attached to one context share one cuBLAS handle (created " +
            std::to_string(g_blas_created.size()) + ")");
  std::unique_ptr<IPluginV3> a2(rt(a.get())->attachToContext(&ctx2));
  check(a2 && g_blas_created.size() == 2, "a second execution context gets its own handle");
  a1.reset();
  check(g_blas_destroyed.empty(), "the handle lives while an instance of its context does");
  b1.reset();
  check(g_blas_destroyed.size() == 1 && g_blas_destroyed[0] == g_blas_created[0],
        "the last instance of a context destroys its handle, once");
  a2.reset();
  check(g_blas_destroyed.size() == 2 && g_blas_destroyed[1] == g_blas_created[1], "the second context's handle too");
  // An instance TensorRT enqueues without attaching it (it times plugins while it builds) takes a handle of its own
  // on its first enqueue -- one, whatever the number of enqueues -- and releases it when it is destroyed. An empty
  // batch (input, offset, mask and output with N = 0): the launcher launches nothing, so no GPU is needed here.
  const Case& c = *find_case(cs, "DeformConv2d");
  std::vector<std::vector<int64_t>> empty_in = c.inputs, empty_out = c.outputs;
  for (size_t i : {size_t(0), size_t(1), size_t(4)}) empty_in[i][0] = 0;
  empty_out[0][0] = 0;
  auto in = descs(empty_in, DataType::kFLOAT), out = descs(empty_out, DataType::kFLOAT);
  auto u = make(dcn, c.fields, "unattached");
  check(rt(u.get())->onShapeChange(in.data(), static_cast<int32_t>(in.size()), out.data(), 1) == 0,
        "DeformConv2d: onShapeChange before an unattached enqueue");
  const void* ins[5] = {};
  void* outs[1] = {};
  std::vector<char> ws(size_t(1) << 20);
  const size_t created = g_blas_created.size(), destroyed = g_blas_destroyed.size(), before = g_logger.lines.size();
  const int32_t rc1 = rt(u.get())->enqueue(in.data(), out.data(), ins, outs, ws.data(), nullptr);
  const int32_t rc2 = rt(u.get())->enqueue(in.data(), out.data(), ins, outs, ws.data(), nullptr);
  check(rc1 == 0 && rc2 == 0 && g_logger.lines.size() == before && g_blas_created.size() == created + 1,
        "enqueue of an unattached DeformConv2d instance runs, taking one cuBLAS handle of its own (created " +
            std::to_string(g_blas_created.size() - created) + ", rc " + std::to_string(rc1) + ", " +
            std::to_string(rc2) + (g_logger.lines.size() > before ? "; log: " + g_logger.lines.back() : "") + ")");
  u.reset();
  check(g_blas_destroyed.size() == destroyed + 1 && g_blas_destroyed.back() == g_blas_created.back(),
        "the unattached instance's handle is destroyed with it");
}

// ---------------------------------------------------------------------------------------------

std::string timing_id(IPluginCreatorV3One* creator, const std::vector<Field>& fields, const char* node = "t") {
  auto p = make(creator, fields, node);
  if (!p) return "<no plugin>";
  const char* id = cap<IPluginV3OneBuild>(p.get(), PluginCapabilityType::kBUILD)->getTimingCacheID();
  return id ? id : "<null>";
}

std::vector<Field> with(std::vector<Field> fields, const Field& f) {
  for (Field& x : fields)
    if (x.name == f.name) {
      x = f;
      return fields;
    }
  fields.push_back(f);
  return fields;
}

std::vector<Field> without(std::vector<Field> fields, const char* name) {
  std::vector<Field> out;
  for (Field& x : fields)
    if (x.name != name) out.push_back(x);
  return out;
}

// IDs differ exactly when the kernel's work would: same attributes (however spelled, whatever the variant or
// node name) -> same ID; any attribute value changed -> another ID.
void check_timing_cache_ids(IPluginCreatorV3One* (*find)(const char*), const std::vector<Case>& cs) {
  for (const Case& c : cs) {
    const std::string id = timing_id(find(c.name), c.fields);
    check(id != "<null>" && id != "<no plugin>", std::string(c.name) + ": a timing-cache ID");
    check(timing_id(find(c.name), c.fields, "other_node") == id, std::string(c.name) + ": ID ignores the node name");
  }
  IPluginCreatorV3One* ra = find("RoIAlign");
  const std::vector<Field>& rf = find_case(cs, "RoIAlign")->fields;
  const std::string rid = timing_id(ra, rf);
  check(timing_id(ra, with(rf, flt("spatial_scale", 0.125f))) != rid, "RoIAlign: spatial_scale changes the ID");
  check(timing_id(ra, with(rf, flt("spatial_scale", 0.25000003f))) != rid, "RoIAlign: a last-bit scale change too");
  check(timing_id(ra, with(rf, str("pool_mode", "avg"))) != rid, "RoIAlign: pool_mode changes the ID");
  check(timing_id(ra, with(rf, ints("sampling_ratio", {0}))) != rid, "RoIAlign: sampling_ratio changes the ID");
  check(timing_id(ra, with(rf, ints("aligned", {0}))) != rid, "RoIAlign: aligned changes the ID");
  // The same RoIAlign as mmdeploy writes it.
  const std::vector<Field> mm = {ints("output_height", {7}), ints("output_width", {7}), flt("spatial_scale", 0.25f),
                                 ints("sampling_ratio", {2}), str("mode", "max"), ints("aligned", {1})};
  check(timing_id(find("MMCVRoiAlign"), mm) == rid, "MMCVRoiAlign with RoIAlign's attributes: the same ID");
  // Absent fields are their defaults.
  const std::vector<Field> dflt = {ints("output_size", {7, 7}), flt("spatial_scale", 0.25f),
                                   ints("sampling_ratio", {2}), ints("aligned", {1}), str("pool_mode", "avg")};
  check(timing_id(ra, without(dflt, "pool_mode")) == timing_id(ra, dflt), "RoIAlign: an absent field = its default");
  // mmcv's float sampling_ratio 2.0 is DeformRoIPool's 2.
  const std::vector<Field> dr = {ints("output_size", {2, 2}), flt("spatial_scale", 1.f), ints("sampling_ratio", {2}),
                                 flt("gamma", 0.1f)};
  const std::vector<Field> mdr = {ints("pooled_height", {2}), ints("pooled_width", {2}), flt("spatial_scale", 1.f),
                                  flt("sampling_ratio", 2.f), flt("gamma", 0.1f)};
  check(timing_id(find("MMCVDeformRoIPool"), mdr) == timing_id(find("DeformRoIPool"), dr),
        "MMCVDeformRoIPool (sampling_ratio 2.0) and DeformRoIPool (2): the same ID");
  check(timing_id(find("DeformRoIPool"), with(dr, flt("gamma", 0.2f))) != timing_id(find("DeformRoIPool"), dr),
        "DeformRoIPool: gamma changes the ID");
  // mmdeploy's pool_mode 1 is "avg".
  const std::vector<Field> ml = {ints("output_size", {3, 5}), flts("featmap_strides", {4.f, 8.f, 16.f}),
                                 ints("sampling_ratio", {0}), ints("finest_scale", {56}), flt("roi_scale_factor", 2.f),
                                 ints("aligned", {0}), str("pool_mode", "avg")};
  const std::vector<Field> mml = {ints("output_height", {3}), ints("output_width", {5}),
                                  flts("featmap_strides", {4.f, 8.f, 16.f}), ints("sampling_ratio", {0}),
                                  ints("finest_scale", {56}), flt("roi_scale_factor", 2.f), ints("aligned", {0}),
                                  ints("pool_mode", {1})};
  IPluginCreatorV3One* mlc = find("MultiLevelRoIAlign");
  check(timing_id(find("MMCVMultiLevelRoiAlign"), mml) == timing_id(mlc, ml),
        "MMCVMultiLevelRoiAlign (pool_mode 1) and MultiLevelRoIAlign (\"avg\"): the same ID");
  check(timing_id(mlc, with(ml, flts("featmap_strides", {4.f, 8.f, 32.f}))) != timing_id(mlc, ml),
        "MultiLevelRoIAlign: featmap_strides change the ID");
  check(timing_id(mlc, with(ml, ints("finest_scale", {112}))) != timing_id(mlc, ml),
        "MultiLevelRoIAlign: finest_scale changes the ID");
  IPluginCreatorV3One* dc = find("DeformConv2d");
  const std::vector<Field>& df = find_case(cs, "DeformConv2d")->fields;
  for (const Field& f : {ints("stride", {1, 2}), ints("padding", {0, 1}), ints("dilation", {2, 1}), ints("groups", {2}),
                         ints("deformable_groups", {1})}) {
    check(timing_id(dc, with(df, f)) != timing_id(dc, df), "DeformConv2d: " + f.name + " changes the ID");
  }
  check(timing_id(find("DeformRoIPool"), dr) != rid && timing_id(dc, df) != rid, "different ops: different IDs");
  // InternImage's TRTDCNv3 is DCNv3; DCNv4's softmax and DCNv3's offset_scale change the work.
  const std::vector<Field>& d3 = find_case(cs, "DCNv3")->fields;
  const std::vector<Field>& d4 = find_case(cs, "DCNv4")->fields;
  check(timing_id(find("TRTDCNv3"), d3) == timing_id(find("DCNv3"), d3), "TRTDCNv3 and DCNv3: the same ID");
  check(timing_id(find("DCNv3"), with(d3, flt("offset_scale", 1.f))) != timing_id(find("DCNv3"), d3),
        "DCNv3: offset_scale changes the ID");
  check(timing_id(find("DCNv4"), with(d4, ints("softmax", {0}))) != timing_id(find("DCNv4"), d4),
        "DCNv4: softmax changes the ID");
  check(timing_id(find("DCNv4"), d4) != timing_id(find("DCNv3"), d3), "DCNv4 and DCNv3: different IDs");
}

// ---------------------------------------------------------------------------------------------

// Index tables (multi-scale deformable attention's level tables): int32 or int64, both of one type, next to float32,
// float16 or bfloat16 data, the output in the data's type; no workspace with int64 tables, their int64 copies with
// int32 ones (3 L values, L the largest of either table's profile maxima), and enqueue refuses int32 tables without
// that workspace.
void check_index_tables(IPluginCreatorV3One* (*find)(const char*), const std::vector<Case>& cs) {
  for (const Case& c : cs) {
    if (c.index_inputs.size() != 2) continue;
    const std::string op = c.name;
    const size_t i0 = c.index_inputs[0], i1 = c.index_inputs[1];
    auto p = make(find(c.name), c.fields, "tables");
    auto* build = cap<IPluginV3OneBuild>(p.get(), PluginCapabilityType::kBUILD);
    auto* rt = cap<IPluginV3OneRuntime>(p.get(), PluginCapabilityType::kRUNTIME);
    const auto nin = static_cast<int32_t>(c.inputs.size()), nout = static_cast<int32_t>(c.outputs.size());
    std::vector<std::vector<int64_t>> all = c.inputs;
    all.insert(all.end(), c.outputs.begin(), c.outputs.end());
    const DataType indexes[] = {DataType::kINT32, DataType::kINT64};
    for (DataType f : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16}) {
      for (DataType a : indexes) {
        for (DataType b : indexes) {
          auto d = dyn_descs(all, f);
          d[i0].desc.type = a;
          d[i1].desc.type = b;
          bool every = true;
          for (int32_t pos = 0; pos < nin + nout; ++pos) every = every && build->supportsFormatCombination(pos, d.data(), nin, nout);
          const std::string combo = " data " + std::to_string(static_cast<int>(f)) + " tables " +
                                    std::to_string(static_cast<int>(a)) + "/" + std::to_string(static_cast<int>(b));
          check(every == (a == b), op + ":" + combo + (a == b ? " accepted" : " rejected"));
          if (a != b) continue;
          std::vector<DataType> in_types(c.inputs.size(), f), out_types(c.outputs.size(), DataType::kINT8);
          in_types[i0] = in_types[i1] = a;
          check(build->getOutputDataTypes(out_types.data(), nout, in_types.data(), nin) == 0 && out_types[0] == f,
                op + ": output in the data's type with" + combo);
        }
      }
    }
    // A profile whose spatial_shapes maxima say 5 levels and level_start_index maxima 4.
    std::vector<std::vector<int64_t>> mx = c.inputs;
    mx[i0] = {5, 2};
    mx[i1] = {4};
    auto out = dyn_descs(c.outputs, DataType::kFLOAT);
    for (DataType t : indexes) {
      std::vector<DataType> types(c.inputs.size(), DataType::kFLOAT);
      types[i0] = types[i1] = t;
      auto in = profile(c.inputs, mx, types);
      const size_t ws = build->getWorkspaceSize(in.data(), nin, out.data(), nout);
      const size_t want = t == DataType::kINT32 ? 3 * 5 * sizeof(int64_t) : 0;
      check(ws == want, op + ": workspace with tables of type " + std::to_string(static_cast<int>(t)) + ": " +
                            std::to_string(ws) + " == " + std::to_string(want));
    }
    auto call = index_typed(descs(c.inputs, DataType::kFLOAT), c, DataType::kINT32);
    auto rout = descs(c.outputs, DataType::kFLOAT);
    check(rt->onShapeChange(call.data(), nin, rout.data(), nout) == 0, op + ": onShapeChange with int32 tables");
    const void* ins[8] = {};
    void* outs[1] = {};
    const size_t before = g_logger.lines.size();
    check(rt->enqueue(call.data(), rout.data(), ins, outs, nullptr, nullptr) != 0 &&
              last_log_has(before, "workspace", "got none"),
          op + ": enqueue with int32 tables and no workspace fails with a log line");
  }
}

// Fields the exporters write that change nothing (im2col_step only batches mmcv's and InternImage's CUDA work):
// accepted, ignored, not serialized.
void check_ignored_fields(IPluginCreatorV3One* (*find)(const char*), const std::vector<Case>& cs) {
  for (const char* name : {"MMCVMultiScaleDeformableAttention", "TRTDCNv3"}) {
    std::vector<Field> fields = find_case(cs, name)->fields;
    fields.push_back(ints("im2col_step", {64}));
    auto p = make(find(name), fields, "im2col");
    const PluginFieldCollection* f =
        p ? cap<IPluginV3OneRuntime>(p.get(), PluginCapabilityType::kRUNTIME)->getFieldsToSerialize() : nullptr;
    check(f != nullptr && fields_text(f).find("im2col_step") == std::string::npos,
          std::string(name) + ": the exporter's im2col_step field is accepted and ignored");
  }
}
