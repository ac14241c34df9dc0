#include "manifest.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <set>

#include "archive.h"
#include "dtype.h"
#include "util.h"

namespace aotpack::detail {
namespace {

using nlohmann::json;

// Every accessor takes `where` (the JSON path so far) so errors point at the key.
[[noreturn]] void bad(const std::string& where, const std::string& what) {
  fail(AOTPACK_MANIFEST_PATH ": " + where + ": " + what);
}

const json& member(const json& obj, const std::string& key, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) bad(where.empty() ? key : where + "." + key, "missing");
  return *it;
}

std::string join_path(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

std::string get_string(const json& obj, const std::string& key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_string()) bad(join_path(where, key), "expected a string");
  return v.get<std::string>();
}

int64_t as_int(const json& v, const std::string& where) {
  // Integers must fit int64 (the Python reader applies the same rule).
  if (!v.is_number_integer() ||
      (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)))
    bad(where, "expected an integer");
  return v.get<int64_t>();
}

int64_t get_int(const json& obj, const std::string& key, const std::string& where) {
  return as_int(member(obj, key, where), join_path(where, key));
}

const json& get_array(const json& obj, const std::string& key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_array()) bad(join_path(where, key), "expected a list");
  return v;
}

const json& get_object(const json& obj, const std::string& key, const std::string& where) {
  const json& v = member(obj, key, where);
  if (!v.is_object()) bad(join_path(where, key), "expected an object");
  return v;
}

std::vector<int64_t> get_dims(const json& obj, const std::string& key, const std::string& where) {
  const json& list = get_array(obj, key, where);
  std::vector<int64_t> dims;
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string at = join_path(where, key) + "[" + std::to_string(i) + "]";
    int64_t d = as_int(list[i], at);
    if (d < 0) bad(at, "negative value " + std::to_string(d));
    dims.push_back(d);
  }
  return dims;
}

std::vector<std::string> get_strings(const json& obj, const std::string& key,
                                     const std::string& where) {
  const json& list = get_array(obj, key, where);
  std::vector<std::string> out;
  for (size_t i = 0; i < list.size(); ++i) {
    if (!list[i].is_string())
      bad(join_path(where, key) + "[" + std::to_string(i) + "]", "expected a string");
    out.push_back(list[i].get<std::string>());
  }
  return out;
}

TensorSpec parse_spec(const json& v, const std::string& where) {
  if (!v.is_object()) bad(where, "expected an object");
  TensorSpec spec;
  spec.name = get_string(v, "name", where);
  try {
    spec.dtype = dtype_from_name(get_string(v, "dtype", where));
  } catch (const Error& e) {
    bad(where + ".dtype", e.what());
  }
  spec.shape = get_dims(v, "shape", where);
  spec.strides = get_dims(v, "strides", where);
  if (spec.shape.size() != spec.strides.size())
    bad(where, "shape " + format_ints(spec.shape) + " and strides " + format_ints(spec.strides) +
                   " differ in length");
  return spec;
}

std::vector<TensorSpec> get_specs(const json& obj, const std::string& key) {
  const json& list = get_array(obj, key, "");
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < list.size(); ++i)
    specs.push_back(parse_spec(list[i], key + "[" + std::to_string(i) + "]"));
  return specs;
}

bool is_sha256_hex(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](unsigned char c) {
           return std::isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

// No listed path (nor a manifest entry) is also a folder of another one ("a" and "a/b"):
// extraction could not write both. The first offender in sorted order is named.
void check_no_file_is_a_folder(const std::unordered_map<std::string, FileRecord>& files) {
  std::vector<std::string> paths;
  for (const auto& [path, record] : files) paths.push_back(path);
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    for (size_t end = path.find('/'); end != std::string::npos; end = path.find('/', end + 1)) {
      const std::string folder = path.substr(0, end);
      if (files.count(folder) || is_manifest_entry(folder))
        bad("files[\"" + path + "\"]", "'" + folder + "' is a file, so it cannot be a folder");
    }
  }
}

std::unordered_map<std::string, FileRecord> get_files(const json& obj) {
  std::unordered_map<std::string, FileRecord> files;
  for (const auto& [path, rec] : get_object(obj, "files", "").items()) {
    const std::string where = "files[\"" + path + "\"]";
    try {
      check_entry_path(path);
    } catch (const Error& e) {
      bad(where, e.what());
    }
    if (is_manifest_entry(path)) bad(where, "the manifest entries cannot be listed in 'files'");
    if (!rec.is_object()) bad(where, "expected an object");
    FileRecord record;
    record.sha256 = get_string(rec, "sha256", where);
    if (!is_sha256_hex(record.sha256))
      bad(where + ".sha256", "not a 64-digit lower-case hex digest");
    int64_t size = get_int(rec, "size", where);
    if (size < 0) bad(where + ".size", "negative");
    record.size = static_cast<uint64_t>(size);
    files.emplace(path, record);
  }
  check_no_file_is_a_folder(files);
  return files;
}

// weight_aliases: an object of strings in which no target is itself an alias (so there is
// no chain and no cycle); keys in sorted order, as the Python reader checks them.
std::map<std::string, std::string> get_weight_aliases(const json& doc) {
  std::map<std::string, std::string> aliases;
  if (!doc.contains("weight_aliases")) return aliases;
  for (const auto& [name, target] : get_object(doc, "weight_aliases", "").items()) {
    if (!target.is_string()) bad("weight_aliases[\"" + name + "\"]", "expected a string");
    aliases[name] = target.get<std::string>();
  }
  for (const auto& [name, first] : aliases) {
    if (!aliases.count(first)) continue;
    std::vector<std::string> path{name};
    std::set<std::string> seen{name};
    std::string target = first;
    while (aliases.count(target) && !seen.count(target)) {
      path.push_back(target);
      seen.insert(target);
      target = aliases.at(target);
    }
    if (seen.count(target)) {
      std::string chain;
      for (const std::string& n : path) chain += "'" + n + "' -> ";
      bad("weight_aliases", "the aliases form a cycle: " + chain + "'" + target + "'");
    }
    bad("weight_aliases[\"" + name + "\"]", "'" + first + "' is itself an alias; an alias must name a tensor "
        "stored in " + std::string(kWeightsPath));
  }
  return aliases;
}

// Deepest nesting of arrays and objects, scanning outside strings; stops past `limit`.
uint64_t nesting_depth(const char* text, size_t size, uint64_t limit) {
  uint64_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (const char* p = text; p != text + size; ++p) {
    const char c = *p;
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
      if (deepest > limit) break;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

json parse_json(const std::string& text, uint64_t max_depth) {
  json doc = parse_strict_json(text.data(), text.size(), max_depth, AOTPACK_MANIFEST_PATH);
  if (!doc.is_object()) fail(AOTPACK_MANIFEST_PATH ": expected a JSON object at the top level");
  return doc;
}

}  // namespace

nlohmann::json parse_strict_json(const char* text, size_t size, uint64_t max_depth,
                                 const std::string& label) {
  if (size >= 3 && std::string(text, 3) == "\xef\xbb\xbf")  // nlohmann would skip it
    fail(label + " starts with a byte-order mark (it must be plain UTF-8 JSON)");
  if (nesting_depth(text, size, max_depth) > max_depth)
    fail(label + " nests deeper than " + std::to_string(max_depth) + " levels");
  try {
    return json::parse(text, text + size);
  } catch (const json::exception& e) {
    fail(label + " is not valid JSON: " + e.what());
  }
}

bool is_manifest_entry(const std::string& path) {
  return path == kManifestPath || path == kManifestDigestPath || path == kManifestSignaturePath;
}

Manifest parse_manifest(const std::string& text, uint64_t max_depth) {
  const json doc = parse_json(text, max_depth);
  Manifest m;
  m.text = text;
  m.format_version = get_int(doc, "format_version", "");
  if (m.format_version < kFormatVersion)
    fail("format_version " + std::to_string(m.format_version) + " is not supported (this runtime reads " +
         std::to_string(kFormatVersion) + "): the archive is from an older aotpack (" +
         (m.format_version < 2 ? "before the versioned kernel launch ABI" : "before weight aliases") +
         "); rebuild it with this aotpack");
  if (m.format_version != kFormatVersion)
    fail("format_version " + std::to_string(m.format_version) + " is not supported (this runtime reads " +
         std::to_string(kFormatVersion) + "): use a newer aotpack runtime");
  m.name = get_string(doc, "name", "");
  m.version = get_string(doc, "version", "");
  if (doc.contains("aotpack_version")) m.aotpack_version = get_string(doc, "aotpack_version", "");
  m.torch_version = get_string(doc, "torch_version", "");
  m.backend = get_string(doc, "backend", "");
  const json& isa = get_object(doc, "target_isa", "");
  if (isa.contains("march")) m.march = get_string(isa, "march", "target_isa");
  m.isa_features = get_strings(isa, "features", "target_isa");
  if (doc.contains("device_limit")) m.device_limit = get_int(doc, "device_limit", "");
  const json& model = get_object(doc, "model", "");
  m.model_library = get_string(model, "library", "model");
  m.model_abi_version = get_int(model, "abi_version", "model");
  m.constants = get_specs(doc, "constants");
  m.inputs = get_specs(doc, "inputs");
  m.outputs = get_specs(doc, "outputs");
  if (doc.contains("mutated_buffers")) m.mutated_buffers = get_strings(doc, "mutated_buffers", "");
  m.files = get_files(doc);
  if (!m.files.count(m.model_library))
    bad("model.library", "'" + m.model_library + "' is not one of the archive's files");
  m.weight_aliases = get_weight_aliases(doc);
  return m;
}

const std::string& stored_name(const Manifest& manifest, const std::string& name) {
  auto it = manifest.weight_aliases.find(name);
  return it == manifest.weight_aliases.end() ? name : it->second;
}

void check_limits(const Manifest& manifest, const Limits& limits) {
  // +3: manifest.json, manifest.sha256 and manifest.sig are entries too.
  if (manifest.files.size() + 3 > limits.max_entries)
    fail("manifest.json lists " + std::to_string(manifest.files.size()) +
         " files, more than the limit of " + std::to_string(limits.max_entries) +
         " entries (AOTPACK_MAX_ENTRIES)");
  std::vector<std::pair<std::string, uint64_t>> sizes;  // in path order: the same file named as by reader.py
  for (const auto& [path, record] : manifest.files) sizes.emplace_back(path, record.size);
  std::sort(sizes.begin(), sizes.end());
  uint64_t total = 0;
  for (const auto& [path, size] : sizes) {
    if (size > limits.max_entry_bytes)
      fail("file '" + path + "' is " + std::to_string(size) +
           " bytes, more than the limit of " + std::to_string(limits.max_entry_bytes) +
           " per entry (AOTPACK_MAX_ENTRY_BYTES)");
    if (size > limits.max_total_bytes - total)
      fail("the files of manifest.json add up to more than the limit of " +
           std::to_string(limits.max_total_bytes) + " bytes (AOTPACK_MAX_TOTAL_BYTES)");
    total += size;
  }
}

}  // namespace aotpack::detail
