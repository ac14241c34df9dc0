// The KServe v2 Open Inference Protocol over REST, as aotpack-serve speaks it: tensor
// datatypes, model metadata, the infer request (JSON tensors and Triton's binary tensor
// data extension) and the infer response. No I/O here: bodies in, bodies out.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "aotpack/types.h"

namespace aotpack::serve {

/// An error the client gets as `{"error": message}` with this HTTP status.
struct HttpError : std::runtime_error {
  HttpError(int status, const std::string& message) : std::runtime_error(message), status(status) {}
  int status;
};

/// The request header of the binary tensor data extension: the JSON part's length in bytes.
constexpr char kHeaderLengthField[] = "Inference-Header-Content-Length";

/// The protocol's datatype name of a dtype ("FP32", "INT64", "BOOL", ...); "" for a dtype
/// the protocol has no name for.
std::string datatype_name(c10::ScalarType dtype);

/// {"name", "datatype", "shape"} of each spec: the metadata's "inputs" / "outputs".
nlohmann::json tensor_metadata(const std::vector<TensorSpec>& specs);

/// What a model takes and returns, and the names its errors use.
struct Signature {
  std::string model;    // model name (the repository folder)
  std::string version;  // version folder
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
};

/// A parsed infer request: the inputs in the model's order and which outputs to return.
struct InferRequest {
  std::string id;  // "" when the request has none
  bool has_id = false;
  std::vector<at::Tensor> inputs;
  std::vector<size_t> outputs;      // indices into Signature::outputs, in the request's order
  std::vector<bool> binary_output;  // per entry of `outputs`
};

/// Parses an infer request body. `header_length` is the value of the
/// Inference-Header-Content-Length header ("" when absent: the whole body is JSON).
/// Throws HttpError(400, ...) naming the problem: malformed JSON, a missing, unknown or
/// repeated input, a wrong datatype or shape, a data element of the wrong type or count,
/// a binary_data_size that does not match, bytes left over, an unknown output.
InferRequest parse_infer_request(const std::string& body, const std::string& header_length,
                                 const Signature& signature);

/// An encoded infer response: the body, its content type, and the JSON part's length for
/// the Inference-Header-Content-Length header (-1 when every output is JSON).
struct InferResponse {
  std::string body;
  std::string content_type;
  int64_t header_length = -1;
};

/// Encodes `outputs` (all of the model's outputs, in its order) for `request`.
InferResponse encode_infer_response(const InferRequest& request, const Signature& signature,
                                    const std::vector<at::Tensor>& outputs);

/// `{"error": message}`.
std::string error_body(const std::string& message);

}  // namespace aotpack::serve
