// aotpack_app ARCHIVE INPUT.npy...: load an .aotpack archive with the C++ API, run it once
// on .npy inputs (one per model input, in manifest order) and print each output.
//
// Inputs are read with the runtime's .npy reader (aotpack::load_npy, the one aotpack-run
// uses). float32 files feed bfloat16 inputs (.npy has no bfloat16).
#include <ATen/core/Tensor.h>
#include <aotpack/runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace {

void print_output(const aotpack::TensorSpec& spec, const at::Tensor& output) {
  constexpr int64_t kShown = 8;
  const at::Tensor values = output.reshape({-1}).to(c10::kDouble);
  std::printf("%s: %s =", spec.name.c_str(), aotpack::describe(output.scalar_type(),
                                                                 output.sizes().vec()).c_str());
  const int64_t shown = std::min(kShown, values.numel());
  for (int64_t i = 0; i < shown; ++i) std::printf(" %.6g", values.data_ptr<double>()[i]);
  if (values.numel() > kShown) std::printf(" ... (%lld values)", (long long)values.numel());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ARCHIVE INPUT.npy...\n", argv[0]);
    return 2;
  }
  try {
    aotpack::Model model = aotpack::Model::load(argv[1]);
    std::printf("loaded %s %s\n", model.name().c_str(), model.version().c_str());
    if (static_cast<size_t>(argc - 2) != model.inputs().size())
      throw aotpack::Error("the model takes " + std::to_string(model.inputs().size()) +
                           " input(s), got " + std::to_string(argc - 2) + " .npy file(s)");
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < model.inputs().size(); ++i) {
      at::Tensor x = aotpack::load_npy(argv[2 + i]);
      if (model.inputs()[i].dtype == c10::kBFloat16 && x.scalar_type() == c10::kFloat)
        x = x.to(c10::kBFloat16);
      inputs.push_back(x);
    }
    const std::vector<at::Tensor> outputs = model.run(inputs);
    for (size_t i = 0; i < outputs.size(); ++i) print_output(model.outputs()[i], outputs[i]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aotpack_app: error: %s\n", e.what());
    return 1;
  }
}
