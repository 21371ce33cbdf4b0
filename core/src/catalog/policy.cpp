// The catalog's policy files: schemes.yaml (weight forms and schemes), ladders.yaml (impls per
// structure), gates.yaml (parity bands per output kind) and bindings/*.yaml (host families'
// decode stacks). Cross-references to structures, forms and ops are checked here, at load.
#include <flashrt/catalog.h>
#include <flashrt/errors.h>
#include <flashrt/utf8.h>

#include <filesystem>
#include <set>

#include "catalog/yaml_fields.h"

namespace frt {
namespace detail {
namespace {

namespace fs = std::filesystem;

// A policy file's top level: a mapping, or a refusal naming the file.
YAML::Node load_mapping(const YamlFields& f, const fs::path& path) {
  YAML::Node root = load_yaml_file(path.string());
  if (!root.IsMap()) f.fail("(top level)", "expected a mapping");
  return root;
}

bool is_file(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

void check_structure(const YamlFields& f, const Catalog& c, const std::string& field,
                     const std::string& name) {
  const std::vector<std::string> known = c.names();
  if (std::find(known.begin(), known.end(), name) == known.end())
    f.fail(field, "'" + name + "' is not a structure of this catalog (known: " + join(known) + ")");
}

WeightForm parse_form(const YamlFields& f, const YAML::Node& node, const std::string& field,
                      const std::string& name) {
  if (!node.IsMap()) f.fail(field, "expected a mapping with format and tag");
  f.check_keys(
      node, field,
      {"format", "group", "symmetric", "scales", "tag", "rows", "act_block", "calibrated"});
  WeightForm w;
  w.name = name;
  w.format = f.named(f.require(node, field, "format"), child(field, "format"), "weight format",
                     parse_weight_format, known_weight_formats());
  w.tag = f.text(f.require(node, field, "tag"), child(field, "tag"));
  if (adopted_only_format(w.format))
    f.fail(child(field, "format"),
           "holds a checkpoint's own values (adopt_prequantized); no scheme packs a host weight "
           "in it");
  if (const YAML::Node rows = node["rows"]) {
    const std::string at = child(field, "rows");
    if (!rows.IsMap()) f.fail(at, "expected a mapping with min (and max)");
    f.check_keys(rows, at, {"min", "max"});
    w.rows_min = f.integer(f.require(rows, at, "min"), child(at, "min"));
    w.rows_max = rows["max"] ? f.integer(rows["max"], child(at, "max")) : -1;
    if (w.rows_min < 1) f.fail(child(at, "min"), "must be >= 1");
    if (w.rows_max != -1 && w.rows_max < w.rows_min) f.fail(child(at, "max"), "below min");
  }
  if (is_group_format(w.format)) {
    const int64_t g = f.integer(f.require(node, field, "group"), child(field, "group"));
    // The GEMM's int4 groups are its activation blocks too (frt_kernel_abi.h, FRT_W_INT4_GEMM);
    // the super-block forms' groups are Q4_K's and Q6_K's sub-blocks. All keep f16 scales.
    const bool gemm = w.format == WeightFormat::int4_gemm || w.format == WeightFormat::int5_gemm ||
                      is_super_format(w.format);
    const int fixed =
        w.format == WeightFormat::int8_super || w.format == WeightFormat::int6_super_gemm ? 16 : 32;
    if (gemm ? g != fixed : (g != 32 && g != 64 && g != 128))
      f.fail(child(field, "group"),
             gemm ? "not in {" + std::to_string(fixed) + "}" : "not in {32, 64, 128}");
    w.group = static_cast<int>(g);
    if (gemm) w.scale_dtype = DType::f16;
    if (const YAML::Node scales = node["scales"]) {
      const std::string dt = f.text(scales, child(field, "scales"));
      if (gemm ? dt != "f16" : (dt != "f32" && dt != "f16"))
        f.fail(child(field, "scales"),
               "'" + dt + (gemm ? "' not in {f16}" : "' not in {f32, f16}"));
      w.scale_dtype = dt == "f16" ? DType::f16 : DType::f32;
    }
  } else if (node["group"] || node["scales"]) {
    f.fail(field,
           "group and scales belong to the group forms (int8_group, int4_group, int4_gemm, "
           "int4_super, int8_super and the gemm forms)");
  }
  if (const YAML::Node block = node["act_block"]) {
    // The int8_gemm layout's activation blocks travel in the ABI's group field (Note [W8A8
    // blocks], kernels/gemm/src/ref/w8a8_blocks_ref.cpp); without it activations are quantized
    // per row.
    if (w.format != WeightFormat::int8_gemm)
      f.fail(child(field, "act_block"), "belongs to int8_gemm forms");
    if (f.integer(block, child(field, "act_block")) != 32)
      f.fail(child(field, "act_block"), "not in {32}");
    w.group = 32;
  }
  if (const YAML::Node sym = node["symmetric"]) {
    if (w.format != WeightFormat::int4_group && w.format != WeightFormat::int4_gemm &&
        w.format != WeightFormat::int5_gemm)
      f.fail(child(field, "symmetric"), "belongs to int4 forms with a min or a zero point");
    w.symmetric = f.boolean(sym, child(field, "symmetric"));
  }
  if (const YAML::Node cal = node["calibrated"]) {
    // The packer rounds int4 groups against the moments; the other forms have no such path.
    if (w.format != WeightFormat::int4_group && w.format != WeightFormat::int4_gemm)
      f.fail(child(field, "calibrated"), "belongs to int4_group and int4_gemm forms");
    // The door records moments in spans that are multiples of 32 (InputMoments::span_for).
    if (w.group != 32) f.fail(child(field, "calibrated"), "calibrated forms take groups of 32");
    w.calibrated = f.boolean(cal, child(field, "calibrated"));
  }
  return w;
}

void load_schemes(Catalog& c, SchemePolicy& p, const fs::path& path) {
  const YamlFields f(escape_invalid_utf8(path.string()));
  const YAML::Node root = load_mapping(f, path);
  f.check_keys(root, "", {"forms", "schemes", "auto", "gated_auto", "keep_host"});
  const YAML::Node forms = f.require(root, "", "forms");
  f.expect_map(forms, "forms", /*allow_empty=*/false);
  for (const auto& kv : forms) {
    const std::string name = kv.first.Scalar();
    p.forms[name] = parse_form(f, kv.second, child("forms", name), name);
  }
  const YAML::Node schemes = f.require(root, "", "schemes");
  f.expect_map(schemes, "schemes", /*allow_empty=*/false);
  for (const auto& kv : schemes) {
    const std::string name = kv.first.Scalar(), field = child("schemes", name);
    if (name == "auto") f.fail(field, "'auto' is the choice among schemes, not a scheme");
    if (!kv.second.IsMap()) f.fail(field, "expected a mapping with description and formats");
    f.check_keys(kv.second, field,
                 {"description", "formats", "requires", "indivisible", "calibration"});
    SchemeSpec s;
    s.name = name;
    s.description = f.text(f.require(kv.second, field, "description"), child(field, "description"));
    const YAML::Node fm = f.require(kv.second, field, "formats");
    f.expect_map(fm, child(field, "formats"), /*allow_empty=*/true);
    for (const auto& sf : fm) {
      const std::string structure = sf.first.Scalar();
      const std::string sfield = child(child(field, "formats"), structure);
      check_structure(f, c, sfield, structure);
      const std::string form = f.text(sf.second, sfield);
      if (!p.forms.count(form)) f.fail(sfield, "'" + form + "' is not a declared form");
      s.formats[structure] = form;
    }
    if (const YAML::Node r = kv.second["requires"])
      s.requires_packages = f.string_list(r, child(field, "requires"), /*allow_empty=*/true);
    if (const YAML::Node ind = kv.second["indivisible"]) {
      s.indivisible = f.text(ind, child(field, "indivisible"));
      if (!p.forms.count(s.indivisible))
        f.fail(child(field, "indivisible"), "'" + s.indivisible + "' is not a declared form");
    }
    bool calibrated = false;
    for (const auto& [structure, form] : s.formats) calibrated |= p.forms.at(form).calibrated;
    if (const YAML::Node cal = kv.second["calibration"]) {
      const std::string at = child(field, "calibration");
      if (!cal.IsMap()) f.fail(at, "expected a mapping with statistics and rows");
      f.check_keys(cal, at, {"statistics", "rows", "span"});
      for (const std::string& st :
           f.string_list(f.require(cal, at, "statistics"), child(at, "statistics"), false)) {
        if (st != name_of(Statistic::input_moments))
          f.fail(child(at, "statistics"), "'" + st + "' not in {input_moments}");
        s.statistics.push_back(Statistic::input_moments);
      }
      s.calibration_rows = f.integer(f.require(cal, at, "rows"), child(at, "rows"));
      if (s.calibration_rows < 1) f.fail(child(at, "rows"), "must be >= 1");
      s.calibration_span = f.integer(f.require(cal, at, "span"), child(at, "span"));
      if (s.calibration_span < 32 || s.calibration_span % 32 != 0)
        f.fail(child(at, "span"), "must be a positive multiple of 32");
      if (!calibrated) f.fail(at, "the scheme names no calibrated form");
    } else if (calibrated) {
      f.fail(field, "names a calibrated form but declares no calibration (statistics, rows)");
    }
    p.schemes[name] = std::move(s);
  }
  const YAML::Node order = f.require(root, "", "auto");
  p.auto_order = f.string_list(order, "auto", /*allow_empty=*/false);
  for (size_t i = 0; i < p.auto_order.size(); ++i)
    if (!p.schemes.count(p.auto_order[i]))
      f.fail("auto[" + std::to_string(i) + "]", "'" + p.auto_order[i] + "' is not a scheme");
  // The last one must always be usable, or "auto" could resolve to nothing.
  if (!p.schemes.at(p.auto_order.back()).requires_packages.empty())
    f.fail("auto", "the last scheme must require no package, so auto always resolves");
  if (const YAML::Node g = root["gated_auto"]) {  // string_list refuses a repeated entry
    p.gated_auto = f.string_list(g, "gated_auto", /*allow_empty=*/true);
    for (size_t i = 0; i < p.gated_auto.size(); ++i)
      if (!p.schemes.count(p.gated_auto[i]))
        f.fail("gated_auto[" + std::to_string(i) + "]",
               "'" + p.gated_auto[i] + "' is not a scheme");
  }

  if (const YAML::Node k = root["keep_host"]) {
    if (!k.IsMap()) f.fail("keep_host", "expected a mapping with min_seat_weights");
    f.check_keys(k, "keep_host", {"min_seat_weights", "account_weights"});
    p.min_seat_weights =
        f.integer(f.require(k, "keep_host", "min_seat_weights"), "keep_host.min_seat_weights");
    if (p.min_seat_weights < 0) f.fail("keep_host.min_seat_weights", "must be >= 0");
    if (const YAML::Node a = k["account_weights"]) {
      p.account_weights = f.integer(a, "keep_host.account_weights");
      if (p.account_weights < 1) f.fail("keep_host.account_weights", "must be >= 1");
    }
  }
}

void load_ladders(const Catalog& c, std::map<std::string, std::vector<Rung>>& out,
                  const fs::path& path) {
  const YamlFields f(escape_invalid_utf8(path.string()));
  const YAML::Node root = load_mapping(f, path);
  f.check_keys(root, "", {"ladders"});
  const YAML::Node ladders = f.require(root, "", "ladders");
  f.expect_map(ladders, "ladders", /*allow_empty=*/false);
  for (const auto& kv : ladders) {
    const std::string structure = kv.first.Scalar(), field = child("ladders", structure);
    check_structure(f, c, field, structure);
    if (!kv.second.IsSequence() || kv.second.size() == 0)
      f.fail(field, "expected a non-empty list of rungs");
    std::vector<Rung> rungs;
    for (size_t i = 0; i < kv.second.size(); ++i) {
      const std::string rf = field + "[" + std::to_string(i) + "]";
      const YAML::Node r = kv.second[i];
      if (!r.IsMap()) f.fail(rf, "expected a mapping with impl, package and op");
      f.check_keys(r, rf, {"impl", "package", "op", "per_node", "packed", "builds"});
      Rung rung;
      rung.impl = f.text(f.require(r, rf, "impl"), child(rf, "impl"));
      rung.package = f.text(f.require(r, rf, "package"), child(rf, "package"));
      if (rung.package.find('/') == std::string::npos)
        f.fail(child(rf, "package"), "'" + rung.package + "' is not '<org>/<name>'");
      rung.op = f.named(f.require(r, rf, "op"), child(rf, "op"), "op", parse_op, known_ops());
      if (const YAML::Node pn = r["per_node"]) rung.per_node = f.boolean(pn, child(rf, "per_node"));
      if (rung.per_node && rung.op != OpKind::linear)
        f.fail(child(rf, "per_node"), "per-node rungs seat each projection with the linear op");
      if (const YAML::Node pk = r["packed"]) rung.packed = f.boolean(pk, child(rf, "packed"));
      if (rung.packed && (rung.op != OpKind::linear || rung.per_node))
        f.fail(child(rf, "packed"), "a packed rung runs the linear op once over every node");
      if (const YAML::Node b = r["builds"])
        rung.builds = f.string_list(b, child(rf, "builds"), /*allow_empty=*/false);
      rungs.push_back(std::move(rung));
    }
    out[structure] = std::move(rungs);
  }
}

void load_gates(std::map<OutputKind, OutputBand>& out, std::optional<SelfCheckSpec>& self_check,
                const fs::path& path) {
  const YamlFields f(escape_invalid_utf8(path.string()));
  const YAML::Node root = load_mapping(f, path);
  f.check_keys(root, "", {"output_kinds", "self_checks"});
  const YAML::Node kinds = f.require(root, "", "output_kinds");
  f.expect_map(kinds, "output_kinds", /*allow_empty=*/false);
  for (const auto& kv : kinds) {
    const std::string field = child("output_kinds", kv.first.Scalar());
    OutputBand b;
    b.kind = f.named(kv.first, field, "output kind", parse_output_kind, known_output_kinds());
    if (!kv.second.IsMap()) f.fail(field, "expected a mapping with metric, pass, warn");
    f.check_keys(kv.second, field, {"metric", "pass", "warn"});
    b.metric = f.text(f.require(kv.second, field, "metric"), child(field, "metric"));
    const std::string expected = b.kind == OutputKind::values ? "cosine" : "top1_agreement";
    if (b.metric != expected)
      f.fail(child(field, "metric"),
             "'" + b.metric + "'; this output kind is scored by " + expected);
    b.pass = f.number(f.require(kv.second, field, "pass"), child(field, "pass"));
    b.warn = f.number(f.require(kv.second, field, "warn"), child(field, "warn"));
    if (!(b.warn > 0 && b.warn <= b.pass && b.pass <= 1))
      f.fail(field, "needs 0 < warn <= pass <= 1");
    out[b.kind] = b;
  }
  if (const YAML::Node checks = root["self_checks"]) {
    f.expect_map(checks, "self_checks", /*allow_empty=*/false);
    f.check_keys(checks, "self_checks", {"decode_loop"});
    const std::string field = "self_checks.decode_loop";
    const YAML::Node d = f.require(checks, "self_checks", "decode_loop");
    if (!d.IsMap())
      f.fail(field,
             "expected a mapping with probe_tokens, top1_agreement, "
             "logits_cosine, keys_cosine");
    f.check_keys(d, field, {"probe_tokens", "top1_agreement", "logits_cosine", "keys_cosine"});
    SelfCheckSpec s;
    s.probe_tokens = f.integer(f.require(d, field, "probe_tokens"), child(field, "probe_tokens"));
    s.top1_agreement =
        f.number(f.require(d, field, "top1_agreement"), child(field, "top1_agreement"));
    s.logits_cosine = f.number(f.require(d, field, "logits_cosine"), child(field, "logits_cosine"));
    s.keys_cosine = f.number(f.require(d, field, "keys_cosine"), child(field, "keys_cosine"));
    if (s.probe_tokens < 1) f.fail(child(field, "probe_tokens"), "must be >= 1");
    for (const auto& [key, value] :
         {std::pair{"top1_agreement", s.top1_agreement},
          std::pair{"logits_cosine", s.logits_cosine}, std::pair{"keys_cosine", s.keys_cosine}})
      if (!(value > 0 && value <= 1)) f.fail(child(field, key), "must be in (0, 1]");
    self_check = s;
  }
}

std::vector<BindingSlot> binding_slots(const YamlFields& f, const YAML::Node& node,
                                       const std::string& field) {
  f.expect_map(node, field, /*allow_empty=*/false);
  std::vector<BindingSlot> out;
  for (const auto& kv : node) {
    const std::string sfield = child(field, kv.first.Scalar());
    BindingSlot s;
    s.name = kv.first.Scalar();
    if (kv.second.IsScalar()) {
      s.path = f.text(kv.second, sfield);
    } else {
      if (!kv.second.IsMap()) f.fail(sfield, "expected a path or {path, required}");
      f.check_keys(kv.second, sfield, {"path", "required"});
      s.path = f.text(f.require(kv.second, sfield, "path"), child(sfield, "path"));
      if (const YAML::Node r = kv.second["required"])
        s.required = f.boolean(r, child(sfield, "required"));
    }
    out.push_back(std::move(s));
  }
  return out;
}

BindingSpec load_binding(const fs::path& path) {
  const YamlFields f(escape_invalid_utf8(path.string()));
  const YAML::Node root = load_mapping(f, path);
  f.check_keys(
      root, "",
      {"name", "description", "layers", "stack", "layer", "kernels", "fused_forms", "attributes"});
  BindingSpec b;
  b.name = f.text(f.require(root, "", "name"), "name");
  if (b.name != path.stem().string())
    f.fail("name", "'" + b.name + "' does not match the file name");
  b.description = f.text(f.require(root, "", "description"), "description");
  b.layers = f.text(f.require(root, "", "layers"), "layers");
  b.stack = binding_slots(f, f.require(root, "", "stack"), "stack");
  b.layer = binding_slots(f, f.require(root, "", "layer"), "layer");
  const YAML::Node kernels = f.require(root, "", "kernels");
  f.expect_map(kernels, "kernels", /*allow_empty=*/false);
  f.check_keys(kernels, "kernels", {"decode", "linear", "ffn"});
  b.decode_package = f.text(f.require(kernels, "kernels", "decode"), "kernels.decode");
  b.linear_package = f.text(f.require(kernels, "kernels", "linear"), "kernels.linear");
  b.ffn_package = f.text(f.require(kernels, "kernels", "ffn"), "kernels.ffn");
  if (const YAML::Node fused = root["fused_forms"]) {
    f.expect_map(fused, "fused_forms", /*allow_empty=*/true);
    for (const auto& kv : fused)
      b.fused_forms[kv.first.Scalar()] = f.text(kv.second, child("fused_forms", kv.first.Scalar()));
  }
  if (const YAML::Node a = root["attributes"]) {
    f.expect_map(a, "attributes", /*allow_empty=*/true);
    f.check_keys(a, "attributes", {"norm_form", "activation", "rope_type"});
    // Each value is parsed once, here, into the core's enums; a name outside a table fails.
    const auto parse_list = [&](const char* key, auto parse, const std::string& known,
                                const char* what, auto& out) {
      const YAML::Node list = a[key];
      if (!list) return;
      const std::vector<std::string> names =
          f.string_list(list, child("attributes", key), /*allow_empty=*/false);
      for (size_t i = 0; i < names.size(); ++i) {
        const auto v = parse(names[i]);
        if (!v)
          f.fail(std::string("attributes.") + key + "[" + std::to_string(i) + "]",
                 std::string("unknown ") + what + " '" + names[i] + "' (known: " + known + ")");
        out.push_back(*v);
      }
    };
    parse_list("norm_form", parse_norm_form, known_norm_forms(), "norm form", b.norm_forms);
    parse_list("activation", parse_activation, known_activations(), "activation", b.activations);
    parse_list("rope_type", parse_rope_kind, known_rope_kinds(), "rotary form", b.rope_kinds);
  }
  return b;
}

// A function structure whose node is an attention node reading keys and values from `cache`:
// each cache kind has its own op.
bool attention_node(const StructureSpec& spec, AttentionCache cache) {
  return spec.match.nodes[0].kind == NodeKind::attention && spec.match.nodes[0].cache == cache;
}

}  // namespace

// A region op reads the structure's slots of its operands' names and computes an activation;
// a scheme's structure needs a ladder. Checked once everything is read.
void check_ladders(const Catalog& c, const fs::path& root) {
  const YamlFields f(escape_invalid_utf8((root / "ladders.yaml").string()));
  for (const auto& [structure, rungs] : c.ladders()) {
    const StructureSpec& spec = c.get(structure);
    for (size_t i = 0; i < rungs.size(); ++i) {
      const Rung& r = rungs[i];
      const std::string field = "ladders." + structure + "[" + std::to_string(i) + "].op";
      if (r.op == OpKind::linear) {
        // One linear op replaces one module: a region (site: parent) is seated per node, or the
        // seat would stand for the whole region and drop what else it computes.
        if (spec.match.site != SiteKind::node && !r.per_node && !r.packed)
          f.fail(field, "the linear op seats one projection; structure '" + structure +
                            "' is a region of " + std::to_string(spec.match.nodes.size()) +
                            " nodes (set per_node: true)");
        if (r.packed && std::any_of(spec.match.nodes.begin(), spec.match.nodes.end(),
                                    [](const MatchNode& n) { return n.kind != NodeKind::linear; }))
          f.fail(field, "a packed rung stacks linear nodes; structure '" + structure +
                            "' has nodes of other kinds");
        continue;
      }
      // A function op replaces the function a recurrence, conv, attention or rotary node calls,
      // or a norm node's forward: no slots to fill, no activation of its own to check.
      const bool function_node =
          spec.kind == "function" && !spec.match.nodes.empty() &&
          (spec.match.nodes[0].kind == NodeKind::recurrence) == (r.op == OpKind::gated_delta) &&
          (spec.match.nodes[0].kind == NodeKind::conv) == (r.op == OpKind::causal_conv1d) &&
          (spec.match.nodes[0].kind == NodeKind::norm) == (r.op == OpKind::rmsnorm) &&
          attention_node(spec, AttentionCache::dense) == (r.op == OpKind::attention) &&
          attention_node(spec, AttentionCache::paged) == (r.op == OpKind::paged_attention) &&
          attention_node(spec, AttentionCache::none) == (r.op == OpKind::sequence_attention) &&
          (spec.match.nodes[0].kind == NodeKind::rotary) == (r.op == OpKind::rotary);
      if (function_op(r.op) || spec.kind == "function") {
        if (!function_op(r.op) || !function_node)
          f.fail(field, std::string("op '") + name_of(r.op) + "' does not replace the function '" +
                            structure + "' describes");
        continue;
      }
      if (op_weight_operands(r.op).empty())
        f.fail(field, std::string("'") + name_of(r.op) + "' is not an op a seat runs");
      for (const std::string& operand : op_weight_operands(r.op)) {
        const bool filled =
            std::any_of(spec.match.nodes.begin(), spec.match.nodes.end(), [&](const MatchNode& n) {
              return (n.kind == NodeKind::linear && n.weight_slot == operand) ||
                     std::find(n.bank_slots.begin(), n.bank_slots.end(), operand) !=
                         n.bank_slots.end();
            });
        if (spec.slot(operand) == nullptr || !filled)
          f.fail(field, std::string("op '") + name_of(r.op) + "' reads slot '" + operand +
                            "', which structure '" + structure +
                            "' does not declare and fill from a linear or experts node");
      }
      // A bank's op routes rows to experts: it seats a bank, and a bank takes no other op.
      const bool bank = std::any_of(spec.match.nodes.begin(), spec.match.nodes.end(),
                                    [](const MatchNode& n) { return n.kind == NodeKind::experts; });
      if (bank != (r.op == OpKind::moe_ffn))
        f.fail(field, std::string("op '") + name_of(r.op) + "' " +
                          (bank ? "does not route rows to experts; structure '" + structure +
                                      "' is a bank of experts"
                                : "routes rows to a bank of experts; structure '" + structure +
                                      "' has no experts node"));
      bool has_act = false;
      for (const MatchNode& n : spec.match.nodes)
        has_act |= n.kind == NodeKind::activation || n.kind == NodeKind::experts;
      if (!has_act)
        f.fail(field, std::string("op '") + name_of(r.op) + "' applies an activation; structure '" +
                          structure + "' matches none");
    }
  }
  const YamlFields sf(escape_invalid_utf8((root / "schemes.yaml").string()));
  for (const auto& [name, scheme] : c.schemes().schemes)
    for (const auto& [structure, form] : scheme.formats)
      if (c.ladder(structure).empty())
        sf.fail("schemes." + name + ".formats." + structure,
                "structure '" + structure + "' has no ladder in ladders.yaml");
}

void load_policy(Catalog& c, const std::string& dir) {
  const fs::path root(dir);
  if (is_file(root / "schemes.yaml")) load_schemes(c, c.schemes_, root / "schemes.yaml");
  if (is_file(root / "ladders.yaml")) load_ladders(c, c.ladders_, root / "ladders.yaml");
  check_ladders(c, root);
  if (is_file(root / "gates.yaml")) load_gates(c.bands_, c.decode_self_check_, root / "gates.yaml");
  std::error_code ec;
  if (fs::is_directory(root / "bindings", ec)) {
    std::vector<fs::path> files;
    for (const fs::directory_entry& e : fs::directory_iterator(root / "bindings"))
      if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
      BindingSpec b = load_binding(p);
      c.bindings_[b.name] = std::move(b);
    }
  }
}

}  // namespace detail

std::string WeightForm::describe() const {
  if (host) return "host precision";
  if (format == WeightFormat::int8_channel) return "int8 per-channel";
  if (format == WeightFormat::int8_gemm)
    return group > 0 ? "int8 per-channel, activations int8 per " + std::to_string(group)
                     : "int8 per-channel, activations int8 per row";
  const std::string scales = scale_dtype == DType::f16 ? " f16 scales" : "";
  const std::string cal = calibrated ? ", calibrated" : "";
  if (format == WeightFormat::int4_gemm)
    return "int4 g" + std::to_string(group) + (symmetric ? " symmetric" : " asymmetric") + scales +
           cal + ", activations int8 per " + std::to_string(group);
  if (format == WeightFormat::int8_group) return "int8 g" + std::to_string(group) + scales;
  if (format == WeightFormat::int4_super) return kInt4SuperForm;
  if (format == WeightFormat::int8_super) return kInt8SuperForm;
  if (format == WeightFormat::int4_super_gemm) return kInt4SuperGemmForm;
  if (format == WeightFormat::int6_super_gemm) return kInt6SuperGemmForm;
  if (format == WeightFormat::int5_super_gemm) return kInt5SuperGemmForm;
  if (format == WeightFormat::int5_gemm)
    return std::string("int5 g32") + (symmetric ? " symmetric" : " asymmetric") + scales +
           ", activations int8 per 32";
  return "int4 g" + std::to_string(group) + (symmetric ? " symmetric" : " asymmetric") + scales +
         cal;
}

const std::vector<Rung>& Catalog::ladder(const std::string& structure) const {
  static const std::vector<Rung> kNone;
  const auto it = ladders_.find(structure);
  return it == ladders_.end() ? kNone : it->second;
}

std::string Catalog::rung_field(const std::string& structure, size_t index) const {
  return dir_ + "/ladders.yaml: ladders." + structure + "[" + std::to_string(index) + "]";
}

const OutputBand& Catalog::band(OutputKind kind) const {
  const auto it = bands_.find(kind);
  if (it == bands_.end())
    throw InvalidArgument("catalog '" + dir_ + "' declares no parity band for output kind '" +
                          name_of(kind) + "' (gates.yaml)");
  return it->second;
}

const SelfCheckSpec& Catalog::decode_self_check() const {
  if (!decode_self_check_)
    throw InvalidArgument("the catalog at " + dir_ +
                          " declares no decode_loop self-check (gates.yaml self_checks)");
  return *decode_self_check_;
}

const BindingSpec& Catalog::binding(const std::string& name) const {
  const auto it = bindings_.find(name);
  if (it == bindings_.end()) {
    std::vector<std::string> known;
    for (const auto& kv : bindings_) known.push_back(kv.first);
    throw InvalidArgument("unknown binding '" + name + "' (known: " + detail::join(known) +
                          ") in catalog '" + dir_ + "'");
  }
  return it->second;
}

std::vector<std::string> Catalog::missing_packages(const std::vector<std::string>& visible) const {
  const std::set<std::string> have(visible.begin(), visible.end());
  std::vector<std::string> out;
  for (const auto& [structure, rungs] : ladders_)
    for (size_t i = 0; i < rungs.size(); ++i)
      if (!have.count(rungs[i].package))
        out.push_back(rung_field(structure, i) + ".package: '" + rungs[i].package +
                      "' is not on the kernel path");
  for (const auto& [name, s] : schemes_.schemes)
    for (const std::string& pkg : s.requires_packages)
      if (!have.count(pkg))
        out.push_back(dir_ + "/schemes.yaml: schemes." + name + ".requires: '" + pkg +
                      "' is not on the kernel path");
  // A binding's packages are not checked here: decode_loop alone needs them, and a machine
  // without them still seats through every other door (the program refuses when it is built).
  return out;
}

}  // namespace frt
