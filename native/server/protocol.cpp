#include "protocol.h"

#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <set>

namespace aotpack::serve {

using nlohmann::json;

namespace {

[[noreturn]] void bad_request(const std::string& message) { throw HttpError(400, message); }

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string type_of(const json& value) {
  if (value.is_number_float()) return "a floating-point number";
  if (value.is_number()) return "an integer";
  const std::string name = value.type_name();
  return (value.is_object() || value.is_array() ? "an " : "a ") + name;
}

// The JSON part: the whole body, or its first Inference-Header-Content-Length bytes.
size_t json_length(const std::string& body, const std::string& header_length) {
  if (header_length.empty()) return body.size();
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(header_length.c_str(), &end, 10);
  if (header_length[0] < '0' || header_length[0] > '9' || *end != '\0' || errno != 0)
    bad_request(std::string(kHeaderLengthField) + " must be a whole number of bytes, got '" +
                header_length + "'");
  if (n > body.size())
    bad_request(std::string(kHeaderLengthField) + " is " + header_length + " but the body has only " +
                std::to_string(body.size()) + " bytes");
  return static_cast<size_t>(n);
}

json parse_json(const std::string& body, size_t length) {
  try {
    return json::parse(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(length));
  } catch (const json::parse_error& e) {
    std::string what = e.what();  // "[json.exception.parse_error.101] parse error at ..."
    if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    bad_request("malformed JSON in the inference request: " + what);
  }
}

// A member of an object, required to have a type: the message names the field and the tensor.
const json& field(const json& object, const char* key, json::value_t type, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) bad_request(where + " has no '" + key + "'");
  if (it->type() != type) {
    const char* want = type == json::value_t::array ? "an array" : type == json::value_t::string ? "a string"
                                                                                                : "an object";
    bad_request(where + ": '" + key + "' must be " + want + ", got " + type_of(*it));
  }
  return *it;
}

// parameters.<key> when present.
const json* parameter(const json& object, const char* key) {
  auto params = object.find("parameters");
  if (params == object.end() || !params->is_object()) return nullptr;
  auto it = params->find(key);
  return it == params->end() ? nullptr : &*it;
}

// JSON "data", flat or nested (row-major), into the tensor's memory.
template <class T>
void fill_from_json(const json& data, const std::string& label, const std::string& datatype,
                    T* out, int64_t numel) {
  int64_t count = 0;
  auto put = [&](const json& value) {
    bool ok;
    if constexpr (std::is_same_v<T, bool>) ok = value.is_boolean();
    else if constexpr (std::is_integral_v<T>) ok = value.is_number_integer();
    else ok = value.is_number();
    if (!ok)
      bad_request(label + ": element " + std::to_string(count) + " of 'data' is " + type_of(value) +
                  ", expected " + (std::is_same_v<T, bool> ? "a boolean" : std::is_integral_v<T> ? "an integer" : "a number") +
                  " for " + datatype);
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const bool fits = value.is_number_unsigned()
                            ? value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
                            : value.get<int64_t>() >= static_cast<int64_t>(std::numeric_limits<T>::min()) &&
                                  value.get<int64_t>() <= static_cast<int64_t>(std::numeric_limits<T>::max());
      if (!fits)
        bad_request(label + ": element " + std::to_string(count) + " of 'data' is " + value.dump() +
                    ", out of range for " + datatype);
    }
    if (count < numel) {
      if constexpr (std::is_same_v<T, bool>) out[count] = value.get<bool>();
      else if constexpr (std::is_integral_v<T>) out[count] = static_cast<T>(value.get<int64_t>());
      else out[count] = static_cast<T>(value.get<double>());
    }
    ++count;
  };
  // Depth-first, in order: nested lists flatten row-major.
  std::vector<std::pair<const json*, size_t>> walk{{&data, 0}};
  while (!walk.empty()) {
    auto& [node, next] = walk.back();
    if (next == node->size()) {
      walk.pop_back();
      continue;
    }
    const json& child = (*node)[next++];
    if (child.is_array()) walk.emplace_back(&child, 0);
    else put(child);
  }
  if (count != numel)
    bad_request(label + ": 'data' has " + std::to_string(count) + " values, the shape needs " +
                std::to_string(numel));
}

void fill_tensor_from_json(at::Tensor& t, const json& data, const std::string& label,
                           const std::string& datatype) {
  if (!data.is_array()) bad_request(label + ": 'data' must be an array, got " + type_of(data));
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case c10::ScalarType::Float: return fill_from_json(data, label, datatype, t.data_ptr<float>(), n);
    case c10::ScalarType::Double: return fill_from_json(data, label, datatype, t.data_ptr<double>(), n);
    case c10::ScalarType::Half: return fill_from_json(data, label, datatype, t.data_ptr<c10::Half>(), n);
    case c10::ScalarType::BFloat16:
      return fill_from_json(data, label, datatype, t.data_ptr<c10::BFloat16>(), n);
    case c10::ScalarType::Long: return fill_from_json(data, label, datatype, t.data_ptr<int64_t>(), n);
    case c10::ScalarType::Int: return fill_from_json(data, label, datatype, t.data_ptr<int32_t>(), n);
    case c10::ScalarType::Short: return fill_from_json(data, label, datatype, t.data_ptr<int16_t>(), n);
    case c10::ScalarType::Char: return fill_from_json(data, label, datatype, t.data_ptr<int8_t>(), n);
    case c10::ScalarType::Byte: return fill_from_json(data, label, datatype, t.data_ptr<uint8_t>(), n);
    case c10::ScalarType::Bool: return fill_from_json(data, label, datatype, t.data_ptr<bool>(), n);
    default: bad_request(label + ": datatype " + datatype + " is not supported");
  }
}

template <class T>
json json_values(const T* data, int64_t numel) {
  json out = json::array();
  out.get_ref<json::array_t&>().reserve(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) {
    if constexpr (std::is_same_v<T, c10::Half> || std::is_same_v<T, c10::BFloat16>)
      out.push_back(static_cast<float>(data[i]));
    else
      out.push_back(data[i]);
  }
  return out;
}

json tensor_json_data(const at::Tensor& t) {
  const int64_t n = t.numel();
  switch (t.scalar_type()) {
    case c10::ScalarType::Float: return json_values(t.data_ptr<float>(), n);
    case c10::ScalarType::Double: return json_values(t.data_ptr<double>(), n);
    case c10::ScalarType::Half: return json_values(t.data_ptr<c10::Half>(), n);
    case c10::ScalarType::BFloat16: return json_values(t.data_ptr<c10::BFloat16>(), n);
    case c10::ScalarType::Long: return json_values(t.data_ptr<int64_t>(), n);
    case c10::ScalarType::Int: return json_values(t.data_ptr<int32_t>(), n);
    case c10::ScalarType::Short: return json_values(t.data_ptr<int16_t>(), n);
    case c10::ScalarType::Char: return json_values(t.data_ptr<int8_t>(), n);
    case c10::ScalarType::Byte: return json_values(t.data_ptr<uint8_t>(), n);
    case c10::ScalarType::Bool: return json_values(t.data_ptr<bool>(), n);
    default: throw HttpError(500, "output dtype " + dtype_name(t.scalar_type()) + " has no protocol datatype");
  }
}

std::string input_names(const Signature& s) {
  std::string out;
  for (const TensorSpec& spec : s.inputs) out += (out.empty() ? "" : ", ") + spec.name;
  return out;
}

std::string output_names(const Signature& s) {
  std::string out;
  for (const TensorSpec& spec : s.outputs) out += (out.empty() ? "" : ", ") + spec.name;
  return out;
}

void parse_outputs(const json& request, const Signature& signature, InferRequest& parsed) {
  bool binary_default = false;
  if (const json* flag = parameter(request, "binary_data_output")) {
    if (!flag->is_boolean()) bad_request("parameters.binary_data_output must be a boolean");
    binary_default = flag->get<bool>();
  }
  auto outputs = request.find("outputs");
  if (outputs == request.end()) {
    for (size_t i = 0; i < signature.outputs.size(); ++i) {
      parsed.outputs.push_back(i);
      parsed.binary_output.push_back(binary_default);
    }
    return;
  }
  if (!outputs->is_array()) bad_request("'outputs' must be an array, got " + type_of(*outputs));
  std::set<std::string> seen;
  for (const json& requested : *outputs) {
    if (!requested.is_object()) bad_request("each entry of 'outputs' must be an object");
    const std::string name = field(requested, "name", json::value_t::string, "a requested output").get<std::string>();
    size_t index = signature.outputs.size();
    for (size_t i = 0; i < signature.outputs.size(); ++i)
      if (signature.outputs[i].name == name) index = i;
    if (index == signature.outputs.size())
      bad_request("unexpected inference output '" + name + "' for model '" + signature.model +
                  "'; its outputs are: " + output_names(signature));
    if (!seen.insert(name).second) bad_request("output '" + name + "' is requested twice");
    bool binary = binary_default;
    if (const json* flag = parameter(requested, "binary_data")) {
      if (!flag->is_boolean()) bad_request("output '" + name + "': parameters.binary_data must be a boolean");
      binary = flag->get<bool>();
    }
    if (parameter(requested, "classification"))
      bad_request("output '" + name + "': the classification extension is not supported");
    parsed.outputs.push_back(index);
    parsed.binary_output.push_back(binary);
  }
}

}  // namespace

std::string datatype_name(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::ScalarType::Bool: return "BOOL";
    case c10::ScalarType::Byte: return "UINT8";
    case c10::ScalarType::Char: return "INT8";
    case c10::ScalarType::Short: return "INT16";
    case c10::ScalarType::Int: return "INT32";
    case c10::ScalarType::Long: return "INT64";
    case c10::ScalarType::Half: return "FP16";
    case c10::ScalarType::BFloat16: return "BF16";
    case c10::ScalarType::Float: return "FP32";
    case c10::ScalarType::Double: return "FP64";
    default: return "";
  }
}

json tensor_metadata(const std::vector<TensorSpec>& specs) {
  json out = json::array();
  for (const TensorSpec& s : specs)
    out.push_back({{"name", s.name}, {"datatype", datatype_name(s.dtype)}, {"shape", s.shape}});
  return out;
}

std::string error_body(const std::string& message) { return json{{"error", message}}.dump(); }

InferRequest parse_infer_request(const std::string& body, const std::string& header_length,
                                 const Signature& signature) {
  const size_t json_bytes = json_length(body, header_length);
  const json request = parse_json(body, json_bytes);
  if (!request.is_object()) bad_request("the inference request must be a JSON object, got " + type_of(request));
  InferRequest parsed;
  if (auto id = request.find("id"); id != request.end()) {
    if (!id->is_string()) bad_request("'id' must be a string, got " + type_of(*id));
    parsed.id = id->get<std::string>();
    parsed.has_id = true;
  }
  const json& inputs = field(request, "inputs", json::value_t::array, "the inference request");
  std::vector<const json*> by_index(signature.inputs.size(), nullptr);
  for (const json& input : inputs) {
    if (!input.is_object()) bad_request("each entry of 'inputs' must be an object, got " + type_of(input));
    const std::string name = field(input, "name", json::value_t::string, "an input").get<std::string>();
    size_t index = signature.inputs.size();
    for (size_t i = 0; i < signature.inputs.size(); ++i)
      if (signature.inputs[i].name == name) index = i;
    if (index == signature.inputs.size())
      bad_request("unexpected inference input '" + name + "' for model '" + signature.model +
                  "'; its inputs are: " + input_names(signature));
    if (by_index[index]) bad_request("input '" + name + "' is given twice");
    by_index[index] = &input;
  }
  size_t offset = json_bytes;  // binary inputs follow the JSON in the inputs' order
  for (size_t i = 0; i < signature.inputs.size(); ++i) {
    if (!by_index[i])
      bad_request("model '" + signature.model + "' expects input '" + signature.inputs[i].name +
                  "', the request has none");
  }
  parsed.inputs.resize(signature.inputs.size());
  for (const json& input : inputs) {  // request order: the binary section's order
    const std::string name = input["name"].get<std::string>();
    size_t i = 0;
    while (signature.inputs[i].name != name) ++i;
    const TensorSpec& spec = signature.inputs[i];
    const std::string label = "input '" + spec.name + "'";
    const std::string want = datatype_name(spec.dtype);
    const std::string got = field(input, "datatype", json::value_t::string, label).get<std::string>();
    if (got != want) bad_request(label + ": the model takes " + want + ", the request says " + got);
    const json& shape_json = field(input, "shape", json::value_t::array, label);
    std::vector<int64_t> shape;
    for (const json& d : shape_json) {
      if (!d.is_number_integer()) bad_request(label + ": 'shape' must hold integers, got " + type_of(d));
      shape.push_back(d.get<int64_t>());
    }
    if (shape != spec.shape)
      bad_request(label + ": the model takes shape " + shape_text(spec.shape) + ", the request says " +
                  shape_text(shape));
    at::Tensor t = at::empty(spec.shape, at::TensorOptions().dtype(spec.dtype));
    const size_t nbytes = static_cast<size_t>(t.numel()) * t.element_size();
    if (const json* size = parameter(input, "binary_data_size")) {
      if (!size->is_number_unsigned())
        bad_request(label + ": parameters.binary_data_size must be a non-negative integer");
      const uint64_t n = size->get<uint64_t>();
      if (n != nbytes)
        bad_request(label + ": binary_data_size is " + std::to_string(n) + " bytes, " + want +
                    shape_text(spec.shape) + " takes " + std::to_string(nbytes));
      if (body.size() - offset < n)
        bad_request(label + ": the body ends " + std::to_string(n - (body.size() - offset)) +
                    " bytes short of its binary data");
      if (n) std::memcpy(t.data_ptr(), body.data() + offset, n);
      offset += n;
      if (input.contains("data")) bad_request(label + ": give 'data' or binary_data_size, not both");
    } else {
      auto data = input.find("data");
      if (data == input.end()) bad_request(label + " has no 'data' and no binary_data_size");
      fill_tensor_from_json(t, *data, label, want);
    }
    parsed.inputs[i] = std::move(t);
  }
  if (offset != body.size())
    bad_request("the request body has " + std::to_string(body.size() - offset) +
                " bytes after the JSON header and the binary inputs it announces");
  parse_outputs(request, signature, parsed);
  return parsed;
}

InferResponse encode_infer_response(const InferRequest& request, const Signature& signature,
                                    const std::vector<at::Tensor>& outputs) {
  json response = {{"model_name", signature.model}, {"model_version", signature.version}};
  if (request.has_id) response["id"] = request.id;
  json entries = json::array();
  std::vector<at::Tensor> binary;
  for (size_t k = 0; k < request.outputs.size(); ++k) {
    const TensorSpec& spec = signature.outputs[request.outputs[k]];
    const at::Tensor t = outputs[request.outputs[k]].contiguous();
    json entry = {{"name", spec.name}, {"datatype", datatype_name(spec.dtype)}, {"shape", spec.shape}};
    if (request.binary_output[k]) {
      entry["parameters"] = {{"binary_data_size", static_cast<uint64_t>(t.numel()) * t.element_size()}};
      binary.push_back(t);
    } else {
      entry["data"] = tensor_json_data(t);
    }
    entries.push_back(std::move(entry));
  }
  response["outputs"] = std::move(entries);
  InferResponse out;
  out.body = response.dump();
  if (binary.empty()) {
    out.content_type = "application/json";
    return out;
  }
  out.header_length = static_cast<int64_t>(out.body.size());
  out.content_type = "application/octet-stream";
  for (const at::Tensor& t : binary)
    out.body.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  return out;
}

}  // namespace aotpack::serve
